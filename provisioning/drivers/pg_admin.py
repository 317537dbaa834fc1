"""Connections to the databases that hold tenant schemas, as the control plane's admin role.

``server`` names a ``DatabaseServer`` record (``TenantSpec.database_server``: the tenant's placement); empty means
the server ``TENANT_DATABASE_URL`` names now, for callers with no tenant (posture checks, a spec built by hand).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from controlplane.errors import ProvisioningError
from provisioning.models import DatabaseServer

__all__ = ["admin_conninfo", "admin_connect", "settings_conninfo", "tenant_conninfo", "tenant_pooled",
           "tenant_admin_connect", "control_plane_database_beside_tenants"]


def settings_conninfo() -> dict[str, Any]:
    """psycopg keyword arguments for ``TENANT_DATABASE_URL`` (or, unset, the control plane's own database)."""
    if settings.TENANT_DATABASE_URL:
        return dict(psycopg.conninfo.conninfo_to_dict(settings.TENANT_DATABASE_URL))
    params = connection.get_connection_params()
    keep = {"dbname", "user", "password", "host", "port", "sslmode"}
    return {k: v for k, v in params.items() if k in keep and v not in (None, "")}


def _server(name: str) -> DatabaseServer:
    server = DatabaseServer.objects.filter(name=name).first()
    if server is None:
        raise ProvisioningError(f"no database server named {name!r}")
    return server


def admin_conninfo(server: str = "") -> dict[str, Any]:
    """psycopg keyword arguments for the admin role on ``server`` (empty: the settings' server)."""
    if not server:
        return settings_conninfo()
    from provisioning.databases.servers import server_conninfo  # it imports this module (settings_conninfo)

    return server_conninfo(_server(server))


def admin_connect(server: str = "", *, autocommit: bool = False) -> psycopg.Connection:
    return psycopg.connect(**admin_conninfo(server), autocommit=autocommit,
                           application_name="controlplane-provisioning")


def tenant_admin_connect(tenant: Any, *, autocommit: bool = False) -> psycopg.Connection:
    """The admin role on the server holding ``tenant``'s schema (read from its placement)."""
    from provisioning.databases.servers import tenant_database_server  # it imports this module

    return admin_connect(tenant_database_server(tenant).name, autocommit=autocommit)


def _pooler(server: str) -> dict[str, Any] | None:
    if not server:
        return None
    from provisioning.databases.servers import server_pooled_conninfo  # it imports this module

    return server_pooled_conninfo(_server(server))


def tenant_pooled(server: str = "") -> bool:
    """Whether instances on ``server`` connect through its transaction pooler (``AGENT_DATABASE_POOLED``)."""
    return _pooler(server) is not None


def tenant_conninfo(*, role: str, password: str, schema: str, server: str = "") -> str:
    """A libpq URL for the tenant's own role.

    Direct: search_path pinned to its schema in the startup options. Through the server's PgBouncer
    (``pooler_dsn``, see ``tenant_pooled``): no startup options (a transaction pooler refuses them); the role's
    own search_path, set at provisioning, applies.
    """
    info = admin_conninfo(server)
    info.pop("passfile", None)
    pooler = _pooler(server)
    if pooler is not None:
        info = {**{k: v for k, v in info.items() if k not in ("host", "port", "dbname", "options")}, **pooler}
        info.update(user=role, password=password)
    else:
        info.update(user=role, password=password, options=f"-c search_path={schema}")
    return psycopg.conninfo.make_conninfo(**info)


def control_plane_database_beside_tenants(server: str = "") -> str | None:
    """The control plane's own database when it is on the tenant server but is not the tenant database.

    The product owns that database, so provisioning takes PUBLIC's CONNECT away from it as it does from
    the tenant database's (``postgres_schema``); other databases of a configured server stay untouched.
    None when tenant schemas live in the control plane's database itself (then tenant roles must connect
    to it: the posture reports that layout as degraded) or on another server.
    """
    params = connection.get_connection_params()
    tenant = admin_conninfo(server)
    same_server = (str(params.get("host") or ""), str(params.get("port") or "5432")) == (
        str(tenant.get("host") or ""), str(tenant.get("port") or "5432"))
    own = str(params.get("dbname") or "")
    return own if same_server and own and own != tenant.get("dbname") else None
