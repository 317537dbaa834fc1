"""Operator API token authentication: ``Authorization: Bearer cpk_<prefix>_<secret>``.

DRF's default is conversations' subclass (``OperatorEndpointAuthentication``), which first refuses and audits a
customer token: customer tokens are that app's, and this one sits below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from tenants.models import Operator, OperatorToken
from tenants.tokens import operator_token_verify


@dataclass(frozen=True)
class OperatorPrincipal:
    """``request.user`` for token requests: the operator acting through one of its tokens."""

    operator: Operator
    token: OperatorToken
    is_authenticated: bool = True
    is_staff: bool = False

    def __str__(self) -> str:
        return f"operator {self.operator.slug}"


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not raw.strip():
            raise exceptions.AuthenticationFailed("use 'Authorization: Bearer <operator API token>'")
        token = operator_token_verify(raw.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API token")
        return OperatorPrincipal(operator=token.operator, token=token), token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.api.authentication.OperatorTokenAuthentication"
    match_subclasses = True  # conversations' OperatorEndpointAuthentication, DRF's default, is the same scheme
    name = "operatorToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Operator API token (cpk_...)"}
