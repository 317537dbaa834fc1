"""Reads of the MCP server registry, always through the caller's operator or tenant. Names and URLs only."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet

from controlplane.errors import NotFound
from tenants.models import Operator, Tenant

from .models import McpServer

__all__ = ["mcp_server_get", "mcp_server_list", "tenant_mcp_server_list", "tenant_mcp_servers"]


def mcp_server_list(*, operator: Operator, tenant: Tenant | None = None) -> QuerySet[McpServer]:
    """The operator's entries for every customer (``tenant`` None), or one customer's own entries."""
    found = McpServer.objects.filter(operator=operator)
    found = found.filter(tenant__isnull=True) if tenant is None else found.filter(tenant=tenant)
    return found.order_by("name")


def mcp_server_get(*, operator: Operator, server_id: object, tenant: Tenant | None = None) -> McpServer:
    """Another operator's (or another customer's) entry and a missing one look the same: 404."""
    try:
        pk = uuid.UUID(str(server_id))
    except ValueError:
        raise NotFound("MCP server not found") from None
    found = mcp_server_list(operator=operator, tenant=tenant).filter(pk=pk).first()
    if found is None:
        raise NotFound("MCP server not found")
    return found


def tenant_mcp_server_list(*, tenant: Tenant) -> list[McpServer]:
    """The servers the tenant's instance gets, by name: the operator's, each replaced by the tenant's own entry of
    the same name."""
    rows = McpServer.objects.filter(Q(tenant__isnull=True, operator_id=tenant.operator_id) | Q(tenant=tenant))
    by_name: dict[str, McpServer] = {}
    for row in rows.order_by("name", "tenant_id"):  # NULLs last: the tenant's own entry is seen first
        by_name.setdefault(row.name, row)
    return [by_name[name] for name in sorted(by_name)]


def tenant_mcp_servers(tenant: Tenant) -> dict[str, Any]:
    """The tenant's servers as the runtime's ``mcp`` configuration (registered with
    provisioning.resources.contributions)."""
    return {row.name: row.spec() for row in tenant_mcp_server_list(tenant=tenant)}
