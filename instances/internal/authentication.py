"""``Authorization: Bearer <instance token>`` for the internal endpoints. Operator tokens are refused."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from provisioning.models import AgentInstance

from ..identity import instance_verify

__all__ = ["InstancePrincipal", "InstanceTokenAuthentication", "IsInstance"]


@dataclass(frozen=True)
class InstancePrincipal:
    """``request.user`` on internal endpoints: one agent instance, hence one tenant."""

    instance: AgentInstance
    is_authenticated: bool = True
    is_staff: bool = False

    def __str__(self) -> str:
        return f"instance {self.instance.pk}"


class InstanceTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[InstancePrincipal, AgentInstance] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed("use 'Authorization: Bearer <instance token>'")
        instance = instance_verify(raw.strip())
        if instance is None:
            raise exceptions.AuthenticationFailed("invalid instance token")
        return InstancePrincipal(instance=instance), instance

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="internal"'


class IsInstance(permissions.BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, InstancePrincipal)
