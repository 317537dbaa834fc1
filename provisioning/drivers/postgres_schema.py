"""Database driver: one PostgreSQL schema per tenant, owned by a dedicated LOGIN role.

The role can use its own schema and nothing else: ``REVOKE ALL ... FROM PUBLIC`` on
its schema and on ``public``, ``search_path`` pinned, no inheritance, no CREATEDB or
CREATEROLE, CONNECT on the tenant database only (PUBLIC has none, nor TEMP); USAGE on
the ``vector`` extension's schema where the server has pgvector (``pg_vector``;
recorded as ``pgvector`` on the resource). Names come from ``TenantSpec.resource_name``
(derived from the tenant id) and are still quoted as identifiers.
Works the same on embedded and real PostgreSQL. A server whose pg_hba.conf trusts tenant roles is refused
(``pg_auth``) unless ``TENANT_DATABASE_ALLOW_INSECURE_AUTH``; the resource records ``auth`` either way.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from psycopg import sql

from controlplane.embedded_pg import DATABASE_ACL_LOCK
from controlplane.errors import ProvisioningError
from controlplane.scram import scram_sha256_verifier

from .base import Observed, Ref, TenantSpec
from .pg_admin import admin_connect, admin_conninfo, control_plane_database_beside_tenants
from .pg_auth import auth_findings
from .pg_vector import ensure_vector_extension
from .protocols import Capability, DatabaseDriver

__all__ = ["PostgresSchemaDriver"]

CONNECTION_LIMIT = 20


def _auth_verdict(conn: psycopg.Connection, *, dbname: str, role: str) -> dict[str, Any]:
    """What to record about the server's authentication; raises while it trusts tenant roles (no override)."""
    findings = auth_findings(conn, dbname=dbname, role=role)
    refused = [f for f in findings if f.refused]
    if refused and not settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH:
        raise ProvisioningError(
            f"refusing to provision onto a server that does not check passwords: {refused[0].sentence}"
            " (TENANT_DATABASE_ALLOW_INSECURE_AUTH=true overrides this, for a test server only)")
    verdict = "insecure-override" if refused else ("weak" if findings else "scram")
    return {"auth": verdict, **({"auth_findings": [f.sentence for f in findings]} if findings else {})}


def _ensure_database_acl(conn: psycopg.Connection, *, role: str, dbname: str, server: str = "") -> None:
    """PUBLIC may not connect to (or make temporary tables in) the tenant database; the role may connect.

    On the embedded server, which the product owns, PUBLIC loses CONNECT on every database; on a configured
    server so does the control plane's own database when it is there too, and other databases are left
    alone (``pg_auth.public_connect_databases`` reports them). Every write rewrites a pg_database row, so
    they happen under one lock, and only when something is missing. The role's CONNECT is asked with
    ``has_database_privilege`` (a lookup), not by expanding the database's ACL: it holds one entry per tenant,
    and expanding it on every onboarding made onboarding slower as the fleet grew (9.2 -> 4.1 tenants/s from
    1,000 to 6,400 tenants, bench/bench_fleet_scale.py).
    """
    state = """
        SELECT d.datname, has_database_privilege('public', d.oid, 'CONNECT')
                          OR has_database_privilege('public', d.oid, 'TEMP'),
               d.datname = current_database() AND has_database_privilege(%s, d.oid, 'CONNECT')
        FROM pg_database d WHERE d.datallowconn AND (d.datname = current_database() OR %s OR d.datname = %s)
    """
    embedded = bool(getattr(settings, "TENANT_DATABASE_EMBEDDED", False))
    own = control_plane_database_beside_tenants(server) or ""

    def pending() -> tuple[list[str], bool]:
        rows = conn.execute(state, (role, embedded, own)).fetchall()
        open_dbs = [db for db, public_open, _ in rows if public_open]
        granted = any(g for db, _, g in rows if db == dbname)
        return open_dbs, granted

    open_dbs, granted = pending()
    if not open_dbs and granted:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (DATABASE_ACL_LOCK,))
        open_dbs, granted = pending()
        for db in open_dbs:
            conn.execute(sql.SQL("REVOKE CONNECT, TEMP ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))
        if open_dbs:  # the role's CONNECT may have come from PUBLIC's: asked again now that PUBLIC has none
            granted = pending()[1]
        if not granted:
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(role)))


class PostgresSchemaDriver(DatabaseDriver):
    name = "postgres-schema"
    capabilities = frozenset[Capability]()

    def ensure(self, spec: TenantSpec) -> Ref:
        password = spec.secrets.get("db_password")
        if not password:
            raise ProvisioningError("the database step needs the tenant's generated password")
        name = spec.resource_name
        ident = sql.Identifier(name)
        verifier = sql.Literal(scram_sha256_verifier(password))
        with admin_connect(spec.database_server) as conn, conn.cursor() as cur:
            # Serialize concurrent ensures of the same tenant (a retried task racing a slow one), then
            # read what exists in the same round trip.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s)),"
                " EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s),"
                " has_schema_privilege('public', 'public', 'USAGE')"
                " OR has_schema_privilege('public', 'public', 'CREATE'), current_database()",
                (f"tenant-db:{name}", name),
            )
            row = cur.fetchone()
            assert row is not None  # a SELECT without FROM returns exactly one row
            _, role_exists, public_open, dbname = row
            # Before anything exists: a server that lets the role in without its password gets no tenant.
            auth = _auth_verdict(conn, dbname=dbname, role=name)
            statements: list[sql.Composable] = [
                sql.SQL(
                    "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION"
                    " NOBYPASSRLS CONNECTION LIMIT {} PASSWORD {}"
                ).format(sql.SQL("ALTER" if role_exists else "CREATE"), ident, sql.Literal(CONNECTION_LIMIT), verifier),
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(ident, ident),
                sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(ident, ident),
                sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(ident),
                sql.SQL("ALTER ROLE {} SET search_path = {}").format(ident, ident),
                sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = '5min'").format(ident),
            ]
            if public_open:
                # Tenants share the database with each other (and, by default, the control plane): nobody
                # but owners may use ``public``. Once, under a global lock: concurrent REVOKEs on the same
                # catalog row fail with "tuple concurrently updated".
                statements += [sql.SQL("SELECT pg_advisory_xact_lock(hashtext('harden-public-schema'))"),
                               sql.SQL("REVOKE ALL ON SCHEMA public FROM PUBLIC")]
            # Every value is composed client-side (identifiers and literals), so the batch goes in one round trip.
            cur.execute(sql.SQL("; ").join(statements))
            # Semantic memory uses pgvector where the server ships it (the runtime detects it; without it the
            # index falls back to float32 bytes), so whether it does is recorded on the resource.
            vector = ensure_vector_extension(conn, name)
        with admin_connect(spec.database_server) as conn:
            _ensure_database_acl(conn, role=name, dbname=dbname, server=spec.database_server)
        info = admin_conninfo(spec.database_server)
        return Ref(
            external_id=f"{info.get('dbname', '')}/{name}",
            details={
                "schema": name,
                "role": name,
                "dbname": info.get("dbname", ""),
                "host": info.get("host", ""),
                "port": str(info.get("port", "")),
                "server": spec.database_server,
                **auth,
                **vector,
            },
        )

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        name = spec.resource_name
        with admin_connect(spec.database_server, autocommit=True) as conn:
            row = conn.execute(
                """
                SELECT (SELECT count(*) FROM pg_roles WHERE rolname = %(n)s),
                       (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %(n)s)
                """,
                {"n": name},
            ).fetchone()
        role_exists, schema_owner = bool(row and row[0]), row[1] if row else None
        if not role_exists or schema_owner is None:
            missing = "role" if not role_exists else "schema"
            return Observed(exists=False, healthy=False, detail=f"{missing} {name} is missing")
        if schema_owner != name:
            return Observed(exists=True, healthy=False, detail=f"schema {name} is owned by {schema_owner}")
        return Observed(exists=True, healthy=True)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        name = spec.resource_name
        ident = sql.Identifier(name)
        with admin_connect(spec.database_server) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tenant-db:{name}",))
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
            if cur.fetchone():
                # End the tenant's own sessions first; DROP ROLE fails while it is connected.
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
                )
                # DROP OWNED also revokes its CONNECT on the database: that row's other writers take this lock.
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (DATABASE_ACL_LOCK,))
                cur.execute(sql.SQL("DROP OWNED BY {}").format(ident))
                cur.execute(sql.SQL("DROP ROLE {}").format(ident))
