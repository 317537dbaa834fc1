"""Access to the conversation API: an operator token or a customer token with the scope the view names."""

from __future__ import annotations

from rest_framework import permissions

from controlplane.errors import NotFound
from conversations.tokens import customer_token_refused
from tenants.api.authentication import OperatorPrincipal
from tenants.api.permissions import scope_held

from .authentication import CustomerPrincipal


def principal_scopes(principal: object) -> frozenset[str]:
    if isinstance(principal, OperatorPrincipal):
        return frozenset(principal.token.scopes)
    if isinstance(principal, CustomerPrincipal):
        return principal.scopes
    return frozenset()


class HasTenantScope(permissions.BasePermission):
    """``view.scopes`` maps each method to the scope it needs."""

    message = "this token lacks the scope this request needs"

    def has_permission(self, request, view) -> bool:
        principal = request.user
        if not isinstance(principal, OperatorPrincipal | CustomerPrincipal):
            return False
        if isinstance(principal, CustomerPrincipal):
            # Another tenant is 404 whatever the scope (checked first, so a 403 says nothing about it).
            tenant_id = str(view.kwargs.get("tenant_id", "")).lower()
            if tenant_id != str(principal.tenant.pk):
                customer_token_refused(token=principal.token, reason="another tenant", path=request.path,
                                       method=request.method)
                raise NotFound("tenant not found")
        needed = view.scopes.get(request.method if request.method != "HEAD" else "GET")
        return scope_held(self, needed, principal_scopes(principal))
