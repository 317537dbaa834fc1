"""Recovery events of one tenant, for its operator (scoped like every tenant endpoint: 404 otherwise)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.openapi import PAGE_PARAMETERS, paginated
from controlplane.pagination import BoundedLimitOffsetPagination
from provisioning.selectors import recovery_event_list
from tenants.api.views import OperatorAPIView
from tenants.selectors import tenant_get

from .serializers import RecoveryEventOutput


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
