"""Reads of OAuth clients and connections, always through the caller's operator or tenant. Metadata only."""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet

from controlplane.errors import NotFound
from tenants.models import Operator, Tenant

from .models import Connection, OAuthClient

__all__ = ["oauth_client_list", "oauth_client_get", "oauth_client_by_provider", "connection_list", "connection_get"]


def oauth_client_list(*, operator: Operator) -> QuerySet[OAuthClient]:
    return OAuthClient.objects.filter(operator=operator).order_by("provider")


def oauth_client_get(*, operator: Operator, client_id: object) -> OAuthClient:
    """Another operator's client and a missing one look the same: 404."""
    try:
        pk = uuid.UUID(str(client_id))
    except ValueError:
        raise NotFound("OAuth client not found") from None
    found = oauth_client_list(operator=operator).filter(pk=pk).first()
    if found is None:
        raise NotFound("OAuth client not found")
    return found


def oauth_client_by_provider(*, operator: Operator, provider: str) -> OAuthClient:
    found = oauth_client_list(operator=operator).filter(provider=provider).first()
    if found is None:
        raise NotFound(f"no OAuth client for provider {provider!r}")
    return found


def connection_list(*, tenant: Tenant, end_user: str | None = None,
                    visible_to: str | None = None) -> QuerySet[Connection]:
    """The tenant's connections, newest first. ``end_user``: only that end user's. ``visible_to``: the caller
    acts for that end user (a customer token bound to them): their own connections and the tenant-wide ones,
    never another end user's (not even that one exists)."""
    found = Connection.objects.filter(tenant=tenant)
    if end_user is not None:
        found = found.filter(end_user=end_user)
    if visible_to is not None:
        found = found.filter(Q(end_user=visible_to) | Q(end_user__isnull=True))
    return found.order_by("-created_at")


def connection_get(*, tenant: Tenant, connection_id: object) -> Connection:
    try:
        pk = uuid.UUID(str(connection_id))
    except ValueError:
        raise NotFound("connection not found") from None
    found = connection_list(tenant=tenant).filter(pk=pk).first()
    if found is None:
        raise NotFound("connection not found")
    return found
