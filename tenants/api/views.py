"""Tenant API views: thin; each validates input, calls one service or selector, shapes output."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.errors import ValidationFailed
from controlplane.openapi import PAGE_PARAMETERS, paginated
from controlplane.pagination import BoundedLimitOffsetPagination
from controlplane.throttles import OnboardingThrottle, OperatorThrottle
from tenants.actors import Actor
from tenants.choices import TenantStatus
from tenants.selectors import tenant_get, tenant_list
from tenants.services import tenant_deprovision, tenant_onboard

from .serializers import TenantCreateInput, TenantOutput


class OperatorAPIView(APIView):
    """Shared base: the caller's operator and acting identity, resolved once; throttled per operator."""

    throttle_classes = [OperatorThrottle]

    def operator(self, request: Request):  # type: ignore[no-untyped-def]
        return request.user.operator

    def actor(self, request: Request) -> Actor:
        return Actor.for_token(request.auth)


class TenantListCreateView(OperatorAPIView):
    throttle_classes = [OperatorThrottle, OnboardingThrottle]

    @extend_schema(
        operation_id="tenants_list", tags=["tenants"],
        description="Your customers (tenants), newest first, optionally by `status`; other operators' are never "
                    "listed.",
        parameters=[OpenApiParameter("status", str, enum=TenantStatus.values, required=False), *PAGE_PARAMETERS],
        responses=paginated(TenantOutput),
    )
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("status") or None
        if wanted is not None and wanted not in TenantStatus.values:
            raise ValidationFailed(f"status must be one of: {', '.join(TenantStatus.values)}")
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(tenant_list(operator=self.operator(request), status=wanted), request)
        data = TenantOutput(page, many=True, context={"request": request}).data
        return paginator.get_paginated_response(data)

    @extend_schema(
        operation_id="tenants_create", tags=["tenants"],
        description="Onboard a customer: 202 with the tenant in `provisioning` while its database schema, "
                    "volume, object prefix, vault and instance are created; poll it (or its `url`) until `ready`. "
                    "The same `Idempotency-Key` returns the same tenant (200).",
        request=TenantCreateInput,
        responses={202: TenantOutput, 200: TenantOutput},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
                                     description="Retries with the same key return the same tenant.")],
    )
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise ValidationFailed("the body must be a JSON object")
        body = TenantCreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        tenant, created = tenant_onboard(
            operator=self.operator(request),
            actor=self.actor(request),
            idempotency_key=request.headers.get("Idempotency-Key"),
            **body.validated_data,
        )
        out = TenantOutput(tenant, context={"request": request}).data
        return Response(out, status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK,
                        headers={"Location": out["url"]})


class TenantDetailView(OperatorAPIView):
    @extend_schema(operation_id="tenants_retrieve", tags=["tenants"], responses=TenantOutput,
                   description="One tenant with its resources and its instance's status; 404 if it is not yours.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        return Response(TenantOutput(tenant, context={"request": request}).data)

    @extend_schema(operation_id="tenants_deprovision", tags=["tenants"], responses={202: TenantOutput},
                   description="Deprovision: 202 while the instance is stopped, the schema archived then dropped and "
                               "the volume and object prefix deleted; the tenant ends `deleted`.")
    def delete(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        tenant = tenant_deprovision(tenant=tenant, actor=self.actor(request))
        return Response(TenantOutput(tenant, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)
