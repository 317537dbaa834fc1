"""``Authorization: Bearer ctk_<prefix>_<secret>``: a customer token, for one tenant and its scopes.

Only the tenant API of this app lists this class. Every other API view authenticates with DRF's default,
``OperatorEndpointAuthentication`` (below): operator tokens only, a customer token refused with 401 and audited.
"""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.drainage import set_override
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from conversations.models import CustomerToken
from conversations.tokens import customer_token_refused, customer_token_verify, looks_like_customer_token
from tenants.api.authentication import OperatorPrincipal, OperatorTokenAuthentication
from tenants.models import Operator, Tenant
from tenants.tokens import Recheck, operator_token_verify_for_tenant, operator_token_verify_for_tenant_cached

__all__ = ["CustomerPrincipal", "CustomerTokenAuthentication", "OperatorEndpointAuthentication",
           "TenantOperatorAuthentication", "TenantOperatorPrincipal"]


@dataclass(frozen=True)
class CustomerPrincipal:
    """``request.user`` for a customer token: one tenant, a few scopes. ``operator`` is for throttling."""

    token: CustomerToken
    tenant: Tenant
    operator: Operator
    scopes: frozenset[str]
    is_authenticated: bool = True
    is_staff: bool = False

    def __str__(self) -> str:
        return f"customer token {self.token.prefix}"


class CustomerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        if scheme.lower() != "bearer" or not looks_like_customer_token(raw):
            return None  # not ours: the operator token authentication decides
        verified = customer_token_verify(raw)
        if not verified.ok:
            if verified.token is not None:
                customer_token_refused(token=verified.token, reason=verified.state, path=request.path,
                                       method=request.method)
            raise exceptions.AuthenticationFailed("invalid, expired or revoked customer token")
        token = verified.token
        assert token is not None
        principal = CustomerPrincipal(token=token, tenant=token.tenant, operator=token.tenant.operator,
                                      scopes=frozenset(token.scopes))
        return principal, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class OperatorEndpointAuthentication(OperatorTokenAuthentication):
    """DRF's default (``REST_FRAMEWORK`` in settings): an operator token; a customer token is never one, and is
    refused with 401 and an audit row ("operator endpoint") on the token it names. OpenAPI: ``operatorToken``."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        if scheme.lower() in ("bearer", "token") and looks_like_customer_token(raw):
            verified = customer_token_verify(raw)
            if verified.token is not None:
                customer_token_refused(token=verified.token, reason="operator endpoint", path=request.path,
                                       method=request.method)
            raise exceptions.AuthenticationFailed("customer tokens cannot call this endpoint")
        return super().authenticate(request)


@dataclass(frozen=True)
class TenantOperatorPrincipal(OperatorPrincipal):
    """An operator token checked together with the tenant its URL names (``asked``): ``tenant`` is that tenant
    when it is the operator's own and not being deleted, else None (the view answers 404)."""

    asked: str = ""
    tenant: Tenant | None = None
    recheck: Recheck | None = None  # a cached verification: what the view's write must confirm


class TenantOperatorAuthentication(OperatorEndpointAuthentication):
    """The tenant API's operator authentication: the token and the tenant of the URL in one statement
    (``operator_token_verify_for_tenant``) instead of two ORM queries; elsewhere the same as its parent.

    A POST to a view whose write confirms its credentials (``write_rechecks_credentials``: a message, a task) takes
    the verification from the process's cache when it can, with the ``Recheck`` its write must pass
    (``TenantAPIView.accepted``): one round trip fewer on the hop (issue 39), a revoke still counting from the
    next request on."""

    def authenticate(self, request):
        return self._authenticate(request, fresh=False)

    def authenticate_again(self, request):
        """After ``CredentialsChanged``: verified now, uncached (the cache entry kept or dropped by the answer)."""
        return self._authenticate(request, fresh=True)

    def _authenticate(self, request, *, fresh: bool):
        context = getattr(request, "parser_context", None) or {}
        tenant_id = (context.get("kwargs") or {}).get("tenant_id")
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        if tenant_id is None or scheme.lower() not in ("bearer", "token") or not raw or looks_like_customer_token(raw):
            return super().authenticate(request)
        recheck = None
        if request.method == "POST" and getattr(context.get("view"), "write_rechecks_credentials", False):
            token, tenant, recheck = operator_token_verify_for_tenant_cached(raw, tenant_id, fresh=fresh)
        else:
            token, tenant = operator_token_verify_for_tenant(raw, tenant_id)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API token")
        return TenantOperatorPrincipal(operator=token.operator, token=token, asked=str(tenant_id),
                                       tenant=tenant, recheck=recheck), token


# The same ``operatorToken`` scheme as its parent in OpenAPI (OperatorTokenScheme matches subclasses); told to
# drf-spectacular, which otherwise warns of two classes registering one component name.
set_override(TenantOperatorAuthentication, "suppress_collision_warning", True)


class CustomerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "conversations.api.authentication.CustomerTokenAuthentication"
    name = "customerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "Customer token (ctk_...): one tenant, the scopes it was minted with."}
