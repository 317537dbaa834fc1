"""Credential API under a tenant: thin views over vault services and selectors. Values are write-only."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import ValidationFailed
from controlplane.openapi import PAGE_PARAMETERS, paginated
from controlplane.pagination import BoundedLimitOffsetPagination
from controlplane.throttles import CredentialsThrottle, OperatorThrottle
from tenants.api.views import OperatorAPIView
from tenants.choices import TokenScope
from tenants.selectors import tenant_get
from vault.selectors import credential_get, credential_list
from vault.services import credential_put, credential_revoke

from .serializers import CredentialOutput, CredentialPutInput

_SAFE = {"GET", "HEAD", "OPTIONS"}


class CredentialAPIView(OperatorAPIView):
    # Shared base: writes need ``credentials:write``; reads the usual ``tenants:read``.
    throttle_classes = [OperatorThrottle, CredentialsThrottle]

    @property
    def required_scope(self) -> str | None:
        return None if self.request.method in _SAFE else TokenScope.CREDENTIALS_WRITE

    def tenant(self, request: Request, tenant_id: str):
        return tenant_get(operator=self.operator(request), tenant_id=tenant_id)


class CredentialListView(CredentialAPIView):
    extra_query_params = ("limit", "offset")

    @extend_schema(operation_id="credentials_list", responses=paginated(CredentialOutput), tags=["credentials"],
                   parameters=PAGE_PARAMETERS,
                   description="Names, versions, timestamps and last use of the tenant's credentials. "
                               "Never values.")
    def get(self, request: Request, tenant_id: str) -> Response:
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(credential_list(tenant=self.tenant(request, tenant_id)), request)
        return paginator.get_paginated_response(CredentialOutput(page, many=True).data)


class CredentialDetailView(CredentialAPIView):
    @extend_schema(operation_id="credentials_retrieve", responses=CredentialOutput, tags=["credentials"],
                   description="Metadata of one credential. Never its value.")
    def get(self, request: Request, tenant_id: str, name: str) -> Response:
        return Response(CredentialOutput(credential_get(tenant=self.tenant(request, tenant_id), name=name)).data)

    @extend_schema(
        operation_id="credentials_put",
        parameters=[OpenApiParameter("name", {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,100}$"},
                                     OpenApiParameter.PATH, description="1-100 ASCII letters, digits, '.', '_', '-'.")],
        request=CredentialPutInput,
        responses={201: CredentialOutput, 200: CredentialOutput},
        tags=["credentials"],
        description="Create the credential (201) or add a new current version (200). Needs `credentials:write`. "
                    "Names starting with `system.` are reserved.",
    )
    def put(self, request: Request, tenant_id: str, name: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        if not isinstance(request.data, dict):
            raise ValidationFailed("the body must be a JSON object")
        body = CredentialPutInput(data=request.data)
        body.is_valid(raise_exception=True)
        credential = credential_put(tenant=tenant, name=name, actor=self.actor(request), **body.validated_data)
        created = credential.current_version == 1
        return Response(CredentialOutput(credential).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(operation_id="credentials_revoke", responses={204: OpenApiResponse(description="Revoked")},
                   tags=["credentials"], description="Revoke the credential: every version is destroyed and the "
                                                     "instance can no longer fetch it.")
    def delete(self, request: Request, tenant_id: str, name: str) -> Response:
        credential_revoke(tenant=self.tenant(request, tenant_id), name=name, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
