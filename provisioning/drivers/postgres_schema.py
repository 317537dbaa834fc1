"""Database driver: one PostgreSQL schema per tenant, owned by a dedicated LOGIN role.

The role can use its own schema and nothing else: ``REVOKE ALL ... FROM PUBLIC`` on
its schema and on ``public``, ``search_path`` pinned, no inheritance, no CREATEDB or
CREATEROLE; USAGE on the ``vector`` extension's schema where the server has pgvector
(``pg_vector``; recorded as ``pgvector`` on the resource). Names come from
``TenantSpec.resource_name`` (derived from the tenant id) and are still quoted as identifiers.
Works the same on embedded and real PostgreSQL.
"""

from __future__ import annotations

from psycopg import sql

from controlplane.errors import ProvisioningError

from .base import Observed, Ref, TenantSpec
from .pg_admin import admin_connect, admin_conninfo
from .pg_vector import ensure_vector_extension
from .scram import scram_sha256_verifier

__all__ = ["PostgresSchemaDriver"]

CONNECTION_LIMIT = 20


class PostgresSchemaDriver:
    name = "postgres-schema"

    def ensure(self, spec: TenantSpec) -> Ref:
        password = spec.secrets.get("db_password")
        if not password:
            raise ProvisioningError("the database step needs the tenant's generated password")
        name = spec.resource_name
        ident = sql.Identifier(name)
        verifier = sql.Literal(scram_sha256_verifier(password))
        with admin_connect() as conn, conn.cursor() as cur:
            # Serialize concurrent ensures of the same tenant (a retried task racing a slow one), then
            # read what exists in the same round trip.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s)),"
                " EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s),"
                " has_schema_privilege('public', 'public', 'USAGE')"
                " OR has_schema_privilege('public', 'public', 'CREATE')",
                (f"tenant-db:{name}", name),
            )
            _, role_exists, public_open = cur.fetchone()
            statements = [
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
        info = admin_conninfo()
        return Ref(
            external_id=f"{info.get('dbname', '')}/{name}",
            details={
                "schema": name,
                "role": name,
                "dbname": info.get("dbname", ""),
                "host": info.get("host", ""),
                "port": str(info.get("port", "")),
                **vector,
            },
        )

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        name = spec.resource_name
        with admin_connect(autocommit=True) as conn:
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
        with admin_connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tenant-db:{name}",))
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
            if cur.fetchone():
                # End the tenant's own sessions first; DROP ROLE fails while it is connected.
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
                )
                cur.execute(sql.SQL("DROP OWNED BY {}").format(ident))
                cur.execute(sql.SQL("DROP ROLE {}").format(ident))
