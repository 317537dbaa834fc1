"""The one place API access is decided: an operator token, with the scope the method needs."""

from __future__ import annotations

from rest_framework import permissions

from tenants.choices import TokenScope

from .authentication import OperatorPrincipal

_SAFE = {"GET", "HEAD", "OPTIONS"}


def scope_held(permission: permissions.BasePermission, needed: str | None, held: frozenset[str] | list[str]) -> bool:
    """Whether ``held`` has ``needed``; when not, the 403's detail names the scope (DRF reads ``message`` off the
    permission instance, one per request), so a caller knows which scope to ask for."""
    if needed is not None and needed in held:
        return True
    permission.message = (f"this token lacks the scope {needed}, which this request needs" if needed
                          else "no token scope allows this request")
    return False


class IsOperator(permissions.BasePermission):
    message = "this token lacks the scope this request needs"

    def has_permission(self, request, view) -> bool:
        principal = request.user
        if not isinstance(principal, OperatorPrincipal):
            return False
        needed = getattr(view, "required_scope", None)
        if needed is None:
            needed = TokenScope.TENANTS_READ if request.method in _SAFE else TokenScope.TENANTS_WRITE
        return scope_held(self, needed, principal.token.scopes)
