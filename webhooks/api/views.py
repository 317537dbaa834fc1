"""Events and webhook endpoints API views: thin; each validates input, calls one service or selector.

Scopes per method (``scopes``): ``events:read`` for events, ``webhooks:read`` / ``webhooks:write`` for
endpoints and deliveries. Everything is looked up through the caller's operator, so another operator's
event, endpoint or delivery is a 404.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.pagination import BoundedCursorPagination
from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from webhooks.selectors import delivery_get, delivery_list, endpoint_get, endpoint_list, event_get, event_list
from webhooks.services import delivery_replay, endpoint_create, endpoint_delete, endpoint_test, endpoint_update

from .serializers import (
    DeliveryOutput,
    DeliveryQuery,
    EmptyInput,
    EndpointCreatedOutput,
    EndpointCreateInput,
    EndpointOutput,
    EndpointUpdateInput,
    EventOutput,
    EventQuery,
    cursor_page,
)

S = TokenScope


class WebhooksView(ScopedView):
    default_scope = S.WEBHOOKS_WRITE


class EventPagination(BoundedCursorPagination):
    """Keyset on the event id (a ULID: time-ordered), newest first."""

    ordering = ("-id",)


class EventListView(WebhooksView):
    scopes = {"GET": S.EVENTS_READ}
    extra_query_params = tuple(EventQuery().fields)

    @extend_schema(operation_id="events_list", tags=["events"], parameters=[EventQuery],
                   responses=cursor_page(EventOutput),
                   description="Your events, newest first, one cursor page at a time: tenant, instance, recovery, "
                               "task and effect changes, recorded in the same transaction as the change. Filter by "
                               "`type` (exact or `tenant.*`), `tenant` and a `created_after`/`created_before` range.")
    def get(self, request: Request) -> Response:
        q = self.query(request, EventQuery)
        events = event_list(operator=self.operator(request), type=q.get("type"),
                            tenant_id=str(q["tenant"]) if q.get("tenant") else None,
                            created_after=q.get("created_after"), created_before=q.get("created_before"))
        paginator = EventPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(EventOutput(page, many=True).data)


class EventDetailView(WebhooksView):
    scopes = {"GET": S.EVENTS_READ}

    @extend_schema(operation_id="events_retrieve", tags=["events"], responses=EventOutput,
                   description="One event by its `evt_` id: the same object its webhook deliveries carried.")
    def get(self, request: Request, event_id: str) -> Response:
        return Response(EventOutput(event_get(operator=self.operator(request), event_id=event_id)).data)


class EndpointListCreateView(WebhooksView):
    scopes = {"GET": S.WEBHOOKS_READ, "POST": S.WEBHOOKS_WRITE}

    @extend_schema(operation_id="webhook_endpoints_list", tags=["webhooks"], responses=EndpointOutput(many=True),
                   description="Your webhook endpoints (deleted ones are not listed), newest first.")
    def get(self, request: Request) -> Response:
        return Response(EndpointOutput(endpoint_list(operator=self.operator(request)), many=True).data)

    @extend_schema(operation_id="webhook_endpoints_create", tags=["webhooks"], request=EndpointCreateInput,
                   responses={201: EndpointCreatedOutput},
                   description="Register an https URL to receive events, all or those in `event_types`. The answer "
                               "carries the signing `secret` once; every request is signed with it as Standard "
                               "Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,...`, see "
                               "docs/webhooks.md).")
    def post(self, request: Request) -> Response:
        body = self.body(request, EndpointCreateInput)
        created = endpoint_create(operator=self.operator(request), actor=self.actor(request), **body)
        out = {**EndpointOutput(created.endpoint).data, "secret": created.secret}
        response = Response(out, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class EndpointDetailView(WebhooksView):
    scopes = {"GET": S.WEBHOOKS_READ, "PATCH": S.WEBHOOKS_WRITE, "DELETE": S.WEBHOOKS_WRITE}

    @extend_schema(operation_id="webhook_endpoints_retrieve", tags=["webhooks"], responses=EndpointOutput,
                   description="One webhook endpoint, with its status (`failing` after a delivery ran out of retries).")
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(EndpointOutput(endpoint_get(operator=self.operator(request), endpoint_id=endpoint_id)).data)

    @extend_schema(operation_id="webhook_endpoints_update", tags=["webhooks"], request=EndpointUpdateInput,
                   responses=EndpointOutput,
                   description="Change the URL, description, event types, or pause it (`is_active: false`).")
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_get(operator=self.operator(request), endpoint_id=endpoint_id)
        body = self.body(request, EndpointUpdateInput)
        return Response(EndpointOutput(endpoint_update(endpoint=endpoint, actor=self.actor(request), **body)).data)

    @extend_schema(operation_id="webhook_endpoints_delete", tags=["webhooks"], responses={204: None},
                   description="Stop sending to this endpoint; deliveries not yet made are cancelled. Its delivery "
                               "log is kept for staff; the endpoint is no longer listed.")
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_get(operator=self.operator(request), endpoint_id=endpoint_id)
        endpoint_delete(endpoint=endpoint, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointTestView(WebhooksView):
    scopes = {"POST": S.WEBHOOKS_WRITE}

    @extend_schema(operation_id="webhook_endpoints_test", tags=["webhooks"], request=EmptyInput,
                   responses={202: DeliveryOutput},
                   description="Queue a signed `webhook.test` event to this endpoint only; follow the returned "
                               "delivery (or the endpoint's deliveries) for the outcome.")
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_get(operator=self.operator(request), endpoint_id=endpoint_id)
        self.body(request, EmptyInput)
        delivery = endpoint_test(endpoint=endpoint, actor=self.actor(request))
        return Response(DeliveryOutput(delivery).data, status=status.HTTP_202_ACCEPTED)


class EndpointDeliveriesView(WebhooksView):
    scopes = {"GET": S.WEBHOOKS_READ}
    extra_query_params = tuple(DeliveryQuery().fields)

    @extend_schema(operation_id="webhook_deliveries_list", tags=["webhooks"],
                   parameters=[DeliveryQuery],
                   responses=cursor_page(DeliveryOutput),
                   description="The endpoint's delivery log, newest first: each delivery's status, next attempt "
                               "and every attempt's answer (status code or error).")
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_get(operator=self.operator(request), endpoint_id=endpoint_id)
        q = self.query(request, DeliveryQuery)
        paginator = BoundedCursorPagination()
        rows = delivery_list(endpoint=endpoint, status=q.get("status")).prefetch_related("attempt_log")
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(DeliveryOutput(page, many=True).data)


class DeliveryReplayView(WebhooksView):
    scopes = {"POST": S.WEBHOOKS_WRITE}

    @extend_schema(operation_id="webhook_deliveries_replay", tags=["webhooks"], request=EmptyInput,
                   responses={202: DeliveryOutput},
                   description="Send a delivery again (a new attempt with the same event id and body), e.g. after "
                               "fixing a receiver that exhausted the retries; 409 while it is being posted.")
    def post(self, request: Request, delivery_id: str) -> Response:
        delivery = delivery_get(operator=self.operator(request), delivery_id=delivery_id)
        self.body(request, EmptyInput)
        delivery = delivery_replay(delivery=delivery, actor=self.actor(request))
        return Response(DeliveryOutput(delivery).data, status=status.HTTP_202_ACCEPTED)
