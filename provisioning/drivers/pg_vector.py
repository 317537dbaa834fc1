"""pgvector for tenant schemas: the extension is created once per database by the control plane (it needs a
superuser), in a schema of its own (`extensions`) that each tenant role is granted USAGE on: the type and
operators are shared by the database, the data stays in each tenant's schema. Plain psycopg, no Django, so
tests can run it against a server of their own.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = ["VECTOR_SCHEMA", "ensure_vector_extension"]

VECTOR_SCHEMA = "extensions"


def ensure_vector_extension(conn: psycopg.Connection, role: str) -> dict[str, Any]:
    """Make `vector` usable by `role` where the server ships it; returns what to record on the database
    resource: {"pgvector": bool, "vector_schema" or "pgvector_detail"}. Idempotent; runs inside the caller's
    transaction (a savepoint, so a refused CREATE EXTENSION leaves the rest of it intact)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector'),"
        " (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        "  WHERE e.extname = 'vector')").fetchone()
    available, schema = (bool(row[0]), row[1]) if row else (False, None)
    if not available:
        return {"pgvector": False, "pgvector_detail": "the server does not ship the vector extension"}
    if schema is None:
        try:
            with conn.transaction():
                # Two onboardings at once would both try to create it: serialize, then IF NOT EXISTS.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('create-extension-vector'))")
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(VECTOR_SCHEMA)))
                conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS vector SCHEMA {}").format(
                    sql.Identifier(VECTOR_SCHEMA)))
                got = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                                   " ON n.oid = e.extnamespace WHERE e.extname = 'vector'").fetchone()
                schema = got[0] if got else VECTOR_SCHEMA
        except psycopg.errors.InsufficientPrivilege as exc:
            return {"pgvector": False, "pgvector_detail": f"CREATE EXTENSION refused: {exc.diag.message_primary}"}
    if schema == "public":
        # Tenants have no rights on public (it holds the control plane's tables); USAGE there is not granted.
        return {"pgvector": False, "pgvector_detail": "vector is installed in schema public, which tenants cannot use"}
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
    return {"pgvector": True, "vector_schema": schema}
