"""Reads of the MCP server registry, always through the caller's operator or tenant. Names and URLs only."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from controlplane.db.rows import model_columns, model_row
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
    # One parameterised statement (`controlplane.db.rows`), not the ORM's: the instance's configuration, asked once
    # per task, reads this, and building the ORM's query cost more CPU than its round trip (issue 39).
    fields, cols = model_columns(McpServer, "m")
    sql = (f"SELECT {cols} FROM {McpServer._meta.db_table} m"  # noqa: S608 - the model's names only
           " WHERE (m.tenant_id IS NULL AND m.operator_id = %s) OR m.tenant_id = %s"
           " ORDER BY m.name, m.tenant_id NULLS LAST")  # the tenant's own entry of a name is seen first
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant.operator_id, tenant.pk])
        rows = [model_row(McpServer, fields, row) for row in cursor.fetchall()]
    by_name: dict[str, McpServer] = {}
    for row in rows:
        by_name.setdefault(row.name, row)
    return [by_name[name] for name in sorted(by_name)]


def tenant_mcp_servers(tenant: Tenant) -> dict[str, Any]:
    """The tenant's servers as the runtime's ``mcp`` configuration (registered with
    provisioning.resources.contributions)."""
    return {row.name: row.spec() for row in tenant_mcp_server_list(tenant=tenant)}
