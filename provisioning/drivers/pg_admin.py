"""Connections to the database that holds tenant schemas, as the control plane's admin role."""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

__all__ = ["admin_conninfo", "admin_connect", "tenant_conninfo"]


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
