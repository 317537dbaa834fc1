"""Connections to the database that holds tenant schemas, as the control plane's admin role."""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

__all__ = ["admin_conninfo", "admin_connect", "tenant_conninfo", "control_plane_database_beside_tenants"]


def admin_conninfo() -> dict[str, Any]:
    """psycopg keyword arguments for the tenant database (``TENANT_DATABASE_URL`` or our own)."""
    if settings.TENANT_DATABASE_URL:
        return dict(psycopg.conninfo.conninfo_to_dict(settings.TENANT_DATABASE_URL))
    params = connection.get_connection_params()
    keep = {"dbname", "user", "password", "host", "port", "sslmode"}
    return {k: v for k, v in params.items() if k in keep and v not in (None, "")}


def admin_connect(*, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(**admin_conninfo(), autocommit=autocommit, application_name="controlplane-provisioning")


def tenant_conninfo(*, role: str, password: str, schema: str) -> str:
    """A libpq URL for the tenant's own role, with search_path pinned to its schema."""
    info = admin_conninfo()
    info.update(user=role, password=password, options=f"-c search_path={schema}")
    return psycopg.conninfo.make_conninfo(**info)


def control_plane_database_beside_tenants() -> str | None:
    """The control plane's own database when it is on the tenant server but is not the tenant database.

    The product owns that database, so provisioning takes PUBLIC's CONNECT away from it as it does from
    the tenant database's (``postgres_schema``); other databases of a configured server stay untouched.
    None when tenant schemas live in the control plane's database itself (then tenant roles must connect
    to it: the posture reports that layout as degraded) or on another server.
    """
    params = connection.get_connection_params()
    tenant = admin_conninfo()
    same_server = (str(params.get("host") or ""), str(params.get("port") or "5432")) == (
        str(tenant.get("host") or ""), str(tenant.get("port") or "5432"))
    own = str(params.get("dbname") or "")
    return own if same_server and own and own != tenant.get("dbname") else None
