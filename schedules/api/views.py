"""``/api/v1/tenants/{id}/schedules``: a customer's schedules and their fires, for the operator's token or the
customer's own (a customer token, like the conversation API: a schedule is a task or message submitted later).

Thin views on the conversation API's base: the caller's operator scopes the tenant (another operator's customer is
a 404), a customer token reaches its own tenant only (another is a 404, audited), the token's ``tasks:read`` /
``tasks:write`` scope gates the method, the input serializer checks shapes and one service or selector does the
rest.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.openapi import PAGE_PARAMETERS, paginated
from controlplane.pagination import BoundedLimitOffsetPagination
from conversations.api.views import TenantAPIView
from tenants.choices import TokenScope
from tenants.models import OperatorToken

from ..selectors import fire_list, schedule_get, schedule_list
from ..services import schedule_create, schedule_delete, schedule_update
from .serializers import FireOutput, ScheduleCreateInput, ScheduleOutput, SchedulePatchInput

S = TokenScope
TAG = ["schedules"]


class ScheduleListView(TenantAPIView):
    scopes = {"GET": S.TASKS_READ, "POST": S.TASKS_WRITE}

    @extend_schema(operation_id="schedules_list", tags=TAG, responses=ScheduleOutput(many=True),
                   description="The customer's schedules, oldest first, each with its next fire times.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        return Response(ScheduleOutput(schedule_list(tenant=tenant), many=True).data)

    @extend_schema(operation_id="schedules_create", tags=TAG, request=ScheduleCreateInput,
                   responses={201: ScheduleOutput, 409: OpenApiResponse(description="The name is taken, or the "
                                                                                    "customer has 100 schedules.")},
                   description="A schedule: `cron` in `timezone`, or once `at`; fires a `task` or a `message`. "
                               "A bad cron expression, zone or moment is a 400 naming the field. Audited.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        body = self.body(request, ScheduleCreateInput)
        schedule = schedule_create(
            tenant=tenant, name=body["name"], cron=body.get("cron"), timezone_name=body["timezone"],
            at=body.get("at"), task=body.get("task"), message=body.get("message"), catch_up=body["catch_up"],
            catch_up_max=body["catch_up_max"], paused=body["paused"], actor=self.actor(request),
            token=request.auth if isinstance(request.auth, OperatorToken) else None)
        return Response(ScheduleOutput(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetailView(TenantAPIView):
    scopes = {"GET": S.TASKS_READ, "PATCH": S.TASKS_WRITE, "DELETE": S.TASKS_WRITE}

    @extend_schema(operation_id="schedules_retrieve", tags=TAG, responses=ScheduleOutput,
                   description="One schedule with its next fire times.")
    def get(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant=self.tenant(request, tenant_id), schedule_id=schedule_id)
        return Response(ScheduleOutput(schedule).data)

    @extend_schema(operation_id="schedules_update", tags=TAG, request=SchedulePatchInput, responses=ScheduleOutput,
                   description="Change any field; `paused: true` pauses, `false` resumes. A new timing or a resume "
                               "starts from the next fire time after now: times that passed meanwhile are not run.")
    def patch(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant=self.tenant(request, tenant_id), schedule_id=schedule_id)
        changes = self.body(request, SchedulePatchInput)
        schedule = schedule_update(schedule=schedule, changes=changes, actor=self.actor(request))
        return Response(ScheduleOutput(schedule).data)

    @extend_schema(operation_id="schedules_destroy", tags=TAG, responses={204: None},
                   description="Delete the schedule and its fire history. Fires already in the inbox still run.")
    def delete(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant=self.tenant(request, tenant_id), schedule_id=schedule_id)
        schedule_delete(schedule=schedule, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScheduleFireListView(TenantAPIView):
    scopes = {"GET": S.TASKS_READ}
    extra_query_params = ("limit", "offset")

    @extend_schema(operation_id="schedules_fires_list", tags=TAG, responses=paginated(FireOutput),
                   parameters=PAGE_PARAMETERS,
                   description="Every fire of the schedule, newest first, with the task (or message) it started.")
    def get(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant=self.tenant(request, tenant_id), schedule_id=schedule_id)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(fire_list(schedule=schedule), request)
        return paginator.get_paginated_response(FireOutput(page, many=True).data)
