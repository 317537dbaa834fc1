"""Connections to the tenant schema: search_path pinned on connect, nothing else schema-qualified."""

from __future__ import annotations

import re

import psycopg

from agent_runtime.errors import ConfigError

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    if not _SCHEMA_RE.match(schema):
        raise ConfigError(f"schema name {schema!r} is not a plain lower-case identifier")
    return schema


def connect(dsn: str, schema: str, *, autocommit: bool = False, application_name: str = "agent_runtime",
            pooled: bool = False) -> psycopg.Connection:
    """Open a connection whose search_path is the tenant schema (and only it).

    `application_name` travels with every transaction, also through PgBouncer in transaction mode (it is one
    of the parameters PgBouncer tracks per client); the single-writer fence reads it (`state.fence`).
    `pooled`: through a transaction-pooling proxy, so no server-side prepared statements (the next
    transaction may run on another server session) and no startup `options` (the role's own search_path,
    pinned at provisioning, applies).
    """
    check_schema_name(schema)
    if pooled:
        return psycopg.connect(dsn, autocommit=autocommit, application_name=application_name,
                               prepare_threshold=None)
    return psycopg.connect(dsn, autocommit=autocommit, options=f"-c search_path={schema}",
                           application_name=application_name)


def reusable(conn: psycopg.Connection) -> bool:
    """Whether `conn` can take the next command.

    Closed is not the only way a connection dies: when a pooler or server goes away mid-query, libpq can keep
    the connection "OK" with the query still marked in flight, and then refuses every later one with "another
    command is already in progress" (seen in CI: a pooled host retried that for 30 s). A connection left in a
    transaction or in an unknown state is not reused either: only an idle one is.
    """
    return not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def lock_key(purpose: str, schema: str) -> str:
    """Text fed to hashtextextended() for advisory locks; purposes never collide across schemas."""
    return f"agent_runtime:{purpose}:{schema}"
