"""The one place API access is decided: an operator token, with the scope the method needs."""

from __future__ import annotations

from rest_framework import permissions

from tenants.choices import TokenScope

from .authentication import OperatorPrincipal

_SAFE = {"GET", "HEAD", "OPTIONS"}


class IsOperator(permissions.BasePermission):
    message = "this token lacks the scope this request needs"

    def has_permission(self, request, view) -> bool:
        principal = request.user
        if not isinstance(principal, OperatorPrincipal):
            return False
        needed = getattr(view, "required_scope", None)
        if needed is None:
            needed = TokenScope.TENANTS_READ if request.method in _SAFE else TokenScope.TENANTS_WRITE
        return needed in principal.token.scopes
