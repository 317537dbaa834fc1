"""Tenant API views: thin; each validates input, calls one service or selector, shapes output."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.openapi import idempotency_key
from controlplane.pagination import BoundedCursorPagination
from controlplane.strict import StrictQueryMixin
from controlplane.throttles import OnboardingThrottle, OperatorThrottle
from provisioning.tenant_actions import instance_restart_request, tenant_resume, tenant_suspend
from tenants.actors import Actor
from tenants.choices import TokenScope
from tenants.models import Plan, Tenant
from tenants.selectors import tenant_get, tenant_list
from tenants.services import tenant_deprovision, tenant_onboard, tenant_update

from .filters import TenantFilterSet
from .serializers import (
    NoInput,
    PlanOutput,
    SuspendInput,
    TenantCreateInput,
    TenantOutput,
    TenantUpdateInput,
)

IDEMPOTENCY_KEY = idempotency_key("Retries with the same key return the first answer.")


class OperatorAPIView(StrictQueryMixin, GenericAPIView):
    """Base of the operator API: the caller's operator and acting identity, per-operator throttling, and
    strict query strings (an unknown parameter is a 400)."""

    throttle_classes = [OperatorThrottle]
    pagination_class = None

    def operator(self, request: Request):  # type: ignore[no-untyped-def]
        return request.user.operator

    def actor(self, request: Request) -> Actor:
        return Actor.for_token(request.auth)

    def body(self, request: Request, serializer_class: type) -> dict:  # type: ignore[type-arg]
        body = serializer_class(data=request.data)
        body.is_valid(raise_exception=True)
        return dict(body.validated_data)

    def tenant_response(self, request: Request, tenant: Tenant, code: int = status.HTTP_200_OK) -> Response:
        return Response(TenantOutput(tenant, context={"request": request}).data, status=code)


class ScopedView(OperatorAPIView):
    """The caller's operator and a scope per method (read by ``tenants.api.permissions.IsOperator``): the
    webhooks, releases and rollouts views."""

    scopes: dict[str, str] = {}
    default_scope: str = TokenScope.TENANTS_WRITE  # a method the view does not list: the strictest it needs
    extra_query_params: tuple[str, ...] = ()  # the base's strict query check: names a view reads

    @property
    def required_scope(self) -> str:
        method = self.request.method if self.request.method != "HEAD" else "GET"
        return self.scopes.get(method or "", self.default_scope)

    @staticmethod
    def query(request: Request, serializer: type) -> dict[str, Any]:
        parsed = serializer(query=request.query_params)
        parsed.is_valid(raise_exception=True)
        return dict(parsed.validated_data)


class TenantListCreateView(OperatorAPIView):
    throttle_classes = [OperatorThrottle, OnboardingThrottle]
    serializer_class = TenantOutput
    pagination_class = BoundedCursorPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = TenantFilterSet

    def get_queryset(self) -> QuerySet[Tenant]:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular reading the filters: no caller
            return Tenant.objects.none()
        return tenant_list(operator=self.operator(self.request))

    @extend_schema(
        operation_id="tenants_list", tags=["tenants"],
        description="Your customers (tenants), newest first, in pages of `limit` (cursor pagination: follow "
                    "`next`); filter by slug, status (repeatable), plan, creation time or a search over slug and "
                    "name. Other operators' are never listed. An unknown parameter is a 400.",
        responses=TenantOutput(many=True),
    )
    def get(self, request: Request) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        operation_id="tenants_create", tags=["tenants"],
        description="Onboard a customer: 202 with the tenant in `provisioning` while its database schema, "
                    "volume, object prefix, vault and instance are created; poll it (or its `url`) until `ready`. "
                    "The same `Idempotency-Key` returns the same tenant (200). The plan must be offered "
                    "(`GET /api/v1/plans`).",
        request=TenantCreateInput, responses={202: TenantOutput, 200: TenantOutput}, parameters=[IDEMPOTENCY_KEY],
    )
    def post(self, request: Request) -> Response:
        tenant, created = tenant_onboard(
            operator=self.operator(request), actor=self.actor(request),
            idempotency_key=request.headers.get("Idempotency-Key"), **self.body(request, TenantCreateInput),
        )
        response = self.tenant_response(request, tenant, status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)
        response["Location"] = response.data["url"]
        return response


class TenantDetailView(OperatorAPIView):
    @extend_schema(operation_id="tenants_retrieve", tags=["tenants"], responses=TenantOutput,
                   description="One tenant with its resources and its instance's status; 404 if it is not yours, "
                               "or once it has been deleted (follow deprovisioning with "
                               "`GET /api/v1/tenants?status=deprovisioning` or the `tenant.deleted` event).")
    def get(self, request: Request, tenant_id: str) -> Response:
        return self.tenant_response(request, tenant_get(operator=self.operator(request), tenant_id=tenant_id,
                                                        live=True))

    @extend_schema(operation_id="tenants_update", tags=["tenants"], request=TenantUpdateInput,
                   responses=TenantOutput,
                   description="Change the name, move to another offered plan, or merge `metadata` (a value `\"\"` "
                               "removes its key). Unknown fields are a 400; a tenant being deleted is a 409.")
    def patch(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_update(tenant=tenant, actor=self.actor(request), **self.body(request, TenantUpdateInput))
        return self.tenant_response(request, tenant_get(operator=self.operator(request), tenant_id=tenant.pk))

    @extend_schema(operation_id="tenants_deprovision", tags=["tenants"], responses={202: TenantOutput},
                   description="Deprovision: 202 while the instance is stopped, the schema archived then dropped and "
                               "the volume and object prefix deleted; the tenant ends `deleted`. From then on "
                               "the tenant answers 404 here.")
    def delete(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_deprovision(tenant=tenant, actor=self.actor(request))
        return self.tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantSuspendView(OperatorAPIView):
    @extend_schema(operation_id="tenants_suspend", tags=["tenants"], request=SuspendInput,
                   responses={202: TenantOutput},
                   description="Suspend: the instance is stopped at its next step boundary (by a worker) and not "
                               "recovered; data and resources are kept, and messages sent meanwhile wait in the "
                               "inbox. Suspending a suspended tenant changes nothing (202 again).")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_suspend(tenant=tenant, actor=self.actor(request), **self.body(request, SuspendInput))
        return self.tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantResumeView(OperatorAPIView):
    @extend_schema(operation_id="tenants_resume", tags=["tenants"], request=None, responses={202: TenantOutput},
                   description="Resume a suspended tenant: `ready` at once, its instance started by a worker (it "
                               "reads back its state and answers what waited in the inbox). Only a suspended (or "
                               "already ready) tenant can be resumed; anything else is a 409.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        self.body(request, NoInput)
        tenant = tenant_resume(tenant=tenant, actor=self.actor(request))
        return self.tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantRestartView(OperatorAPIView):
    @extend_schema(operation_id="tenants_restart", tags=["tenants"], request=None, responses={202: TenantOutput},
                   description="Restart the instance: a worker stops it at its next step boundary and starts it "
                               "again; it resumes from its last checkpoint. Not recorded as a recovery. 409 unless "
                               "the tenant is ready or degraded.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        self.body(request, NoInput)
        tenant = instance_restart_request(tenant=tenant, actor=self.actor(request))
        return self.tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class PlanListView(OperatorAPIView):
    @extend_schema(operation_id="plans_list", tags=["plans"], responses=PlanOutput(many=True),
                   description="The plans a new or existing tenant can be put on, with their daily quotas "
                               "(null: no limit).")
    def get(self, request: Request) -> Response:
        plans = Plan.objects.filter(is_active=True).order_by("slug")
        return Response(PlanOutput(plans, many=True).data)
