"""Writes of the MCP server registry: register and remove a server, for every customer of an operator or for one.

A server is checked on write with the runtime's own rules (``releases.effects_config``: the control plane never
imports agent code), its URL must be https (``MCP_SERVERS_ALLOW_HTTP`` opens plain http for development and
tests), and the token it names must exist where it will be read: a customer's entry names a credential its vault
holds, and a connection's provider must be one the operator has an OAuth client for. An operator-wide entry's
credential is a name each customer's vault is expected to hold; a customer without it has its task wait on the
credential, like any credential the agent names. Audited, names and URLs only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.db import IntegrityError, transaction

from connections.models import OAuthClient
from controlplane.errors import Conflict, ValidationFailed
from releases.effects_config import effects_config_check
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator, Tenant
from vault.selectors import credential_list

from .choices import NAME_RE
from .models import McpServer
from .selectors import mcp_server_get

__all__ = ["mcp_server_create", "mcp_server_delete"]


def _url_check(url: str) -> None:
    parts = urlparse(url)
    allowed = ("https", "http") if settings.MCP_SERVERS_ALLOW_HTTP else ("https",)
    if parts.scheme not in allowed or not parts.netloc:
        raise ValidationFailed("url must be an https:// URL (the server's streamable HTTP endpoint)",
                               extra={"field": "url"})


def _token_source_check(*, operator: Operator, tenant: Tenant | None, credential: str, connection: str) -> None:
    if credential and connection:
        raise ValidationFailed("a server takes its token from a credential or a connection, not both",
                               extra={"field": "connection"})
    if credential and tenant is not None:
        held = credential_list(tenant=tenant).filter(name=credential, revoked_at__isnull=True,
                                                     consumed_at__isnull=True).exists()
        if not held:
            raise ValidationFailed(f"credential: the customer's vault holds no credential named {credential[:100]!r}; "
                                   "store it first (PUT /api/v1/tenants/{id}/credentials/{name})",
                                   extra={"field": "credential"})
    if connection and not OAuthClient.objects.filter(operator=operator, provider=connection).exists():
        raise ValidationFailed(f"connection: you have no OAuth client for provider {connection[:60]!r} "
                               "(POST /api/v1/oauth-clients)", extra={"field": "connection"})


def mcp_server_create(*, operator: Operator, tenant: Tenant | None, actor: Actor, name: str, url: str,
                      credential: str = "", connection: str = "", trust_annotations: bool = True,
                      timeout_s: float = 30.0, tools: dict[str, Any] | None = None,
                      allowed_tools: list[str] | None = None) -> McpServer:
    """Register a server for every customer of ``operator`` (``tenant`` None) or for one; 409 when the name is
    taken at that level."""
    if not NAME_RE.fullmatch(name):
        raise ValidationFailed("name must be 1-60 characters of a-z 0-9 _ - (starting with a letter or digit)",
                               extra={"field": "name"})
    _url_check(url)
    _token_source_check(operator=operator, tenant=tenant, credential=credential, connection=connection)
    row = McpServer(operator=operator, tenant=tenant, name=name, url=url, credential=credential,
                    connection=connection, trust_annotations=trust_annotations, timeout_s=timeout_s,
                    tools=dict(tools or {}), allowed_tools=list(allowed_tools) if allowed_tools is not None else None,
                    created_by=actor.label)
    # The runtime's own check of the spec the instance will get (tool kinds, TTLs, timeouts).
    effects_config_check({"mcp": {name: row.spec()}}, root="")
    try:
        with transaction.atomic():
            row.save()
            audit_record(actor=actor, action=AuditAction.MCP_SERVER_CREATE, target=row, tenant=tenant,
                         operator=operator, data={"name": name, "url": url,
                                                  "tenant": str(tenant.pk) if tenant else None,
                                                  "credential": credential or None, "connection": connection or None})
    except IntegrityError:
        where = "this customer" if tenant is not None else "your customers"
        raise Conflict(f"an MCP server named {name!r} is already registered for {where}") from None
    return row


def mcp_server_delete(*, operator: Operator, tenant: Tenant | None, server_id: object, actor: Actor) -> McpServer:
    """Remove an entry: the instance's next task no longer gets it (a task already running keeps what it started
    with, as with any configuration)."""
    row = mcp_server_get(operator=operator, server_id=server_id, tenant=tenant)
    with transaction.atomic():
        audit_record(actor=actor, action=AuditAction.MCP_SERVER_DELETE, target=row, tenant=tenant, operator=operator,
                     data={"name": row.name, "url": row.url, "tenant": str(tenant.pk) if tenant else None})
        row.delete()
    return row
