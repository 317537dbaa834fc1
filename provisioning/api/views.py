"""The operator's tenant API: onboard, list, read, change and deprovision tenants, suspend, resume and restart
their instances, and each tenant's recoveries. Thin views: each validates its input, calls one service or
selector and shapes the output; a tenant of another operator is a 404 (``tenants.selectors.tenant_get``)."""

from __future__ import annotations

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.openapi import PAGE_PARAMETERS, idempotency_key, paginated
from controlplane.pagination import BoundedCursorPagination, BoundedLimitOffsetPagination
from controlplane.throttles import OnboardingThrottle, OperatorThrottle
from provisioning.fleet.actions import instance_restart_request, tenant_resume, tenant_suspend
from provisioning.selectors import recovery_event_list
from provisioning.workflows.onboarding import tenant_deprovision, tenant_onboard
from tenants.api.serializers import NoInput
from tenants.api.views import OperatorAPIView
from tenants.models import Tenant
from tenants.selectors import tenant_get, tenant_list
from tenants.services import tenant_update

from .filters import TenantFilterSet
from .serializers import (
    RecoveryEventOutput,
    SuspendInput,
    TenantCreateInput,
    TenantOutput,
    TenantUpdateInput,
)

IDEMPOTENCY_KEY = idempotency_key("Retries with the same key return the first answer.")


def tenant_response(request: Request, tenant: Tenant, code: int = status.HTTP_200_OK) -> Response:
    return Response(TenantOutput(tenant, context={"request": request}).data, status=code)


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
        response = tenant_response(request, tenant, status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)
        response["Location"] = response.data["url"]
        return response


class TenantDetailView(OperatorAPIView):
    @extend_schema(operation_id="tenants_retrieve", tags=["tenants"], responses=TenantOutput,
                   description="One tenant with its resources and its instance's status; 404 if it is not yours, "
                               "or once it has been deleted (follow deprovisioning with "
                               "`GET /api/v1/tenants?status=deprovisioning` or the `tenant.deleted` event).")
    def get(self, request: Request, tenant_id: str) -> Response:
        return tenant_response(request, tenant_get(operator=self.operator(request), tenant_id=tenant_id,
                                                        live=True))

    @extend_schema(operation_id="tenants_update", tags=["tenants"], request=TenantUpdateInput,
                   responses=TenantOutput,
                   description="Change the name, move to another offered plan, or merge `metadata` (a value `\"\"` "
                               "removes its key). Unknown fields are a 400; a tenant being deleted is a 409.")
    def patch(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_update(tenant=tenant, actor=self.actor(request), **self.body(request, TenantUpdateInput))
        return tenant_response(request, tenant_get(operator=self.operator(request), tenant_id=tenant.pk))

    @extend_schema(operation_id="tenants_deprovision", tags=["tenants"], responses={202: TenantOutput},
                   description="Deprovision: 202 while the instance is stopped, the schema archived then dropped and "
                               "the volume and object prefix deleted; the tenant ends `deleted`. From then on "
                               "the tenant answers 404 here.")
    def delete(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_deprovision(tenant=tenant, actor=self.actor(request))
        return tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantSuspendView(OperatorAPIView):
    @extend_schema(operation_id="tenants_suspend", tags=["tenants"], request=SuspendInput,
                   responses={202: TenantOutput},
                   description="Suspend: the instance is stopped at its next step boundary (by a worker) and not "
                               "recovered; data and resources are kept, and messages sent meanwhile wait in the "
                               "inbox. Suspending a suspended tenant changes nothing (202 again).")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        tenant = tenant_suspend(tenant=tenant, actor=self.actor(request), **self.body(request, SuspendInput))
        return tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantResumeView(OperatorAPIView):
    @extend_schema(operation_id="tenants_resume", tags=["tenants"], request=None, responses={202: TenantOutput},
                   description="Resume a suspended tenant: `ready` at once, its instance started by a worker (it "
                               "reads back its state and answers what waited in the inbox). Only a suspended (or "
                               "already ready) tenant can be resumed; anything else is a 409.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        self.body(request, NoInput)
        tenant = tenant_resume(tenant=tenant, actor=self.actor(request))
        return tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantRestartView(OperatorAPIView):
    @extend_schema(operation_id="tenants_restart", tags=["tenants"], request=None, responses={202: TenantOutput},
                   description="Restart the instance: a worker stops it at its next step boundary and starts it "
                               "again; it resumes from its last checkpoint. Not recorded as a recovery. 409 unless "
                               "the tenant is ready or degraded.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        self.body(request, NoInput)
        tenant = instance_restart_request(tenant=tenant, actor=self.actor(request))
        return tenant_response(request, tenant, status.HTTP_202_ACCEPTED)


class TenantRecoveryListView(OperatorAPIView):
    extra_query_params = ("limit", "offset")

    @extend_schema(operation_id="tenants_recoveries_list", responses=paginated(RecoveryEventOutput),
                   parameters=PAGE_PARAMETERS, tags=["recoveries"],
                   description="The tenant's recoveries, newest first: why the instance was restarted, how long it "
                               "took and what it resumed.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(recovery_event_list(tenant=tenant), request)
        return paginator.get_paginated_response(RecoveryEventOutput(page, many=True).data)
