"""Task notifications stay inside their tenant (docs/security.md, row 3m).

Two tenants' schemas and roles in one database, as on a shared tenant database server. PostgreSQL has no
permissions on LISTEN: any role may listen on any name. So B's submits notify a channel whose name is random and
kept in B's schema (migration 19), with an empty payload. A's role listens on the former channel, on every name it
can derive from what it knows of B, on every name it can find in what the server shows it, and on its own channel:
it hears nothing of B's submits, and cannot read B's channel name. B's real host, booted on a schema from before
(version 18, migrated at boot), is woken at once by ``submit``, ``submit_once`` and ``retry`` although its own look
is 10 s away, and a listener of B's hears each with an empty payload. Real PostgreSQL, real host, nothing patched.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import LATEST_VERSION, migrate

from .conftest import ADMIN_DSN, HostRunner, TenantDB, make_env
from .harness import add_tenant_schema, create_tenant_db, drop_tenant_db, schema_at_version
from .test_host import wait_status


@pytest.fixture
def two_tenants() -> Iterator[tuple[TenantDB, TenantDB]]:
    a = create_tenant_db(ADMIN_DSN)
    b = add_tenant_schema(a)
    try:
        yield a, b
    finally:
        drop_tenant_db(a, ADMIN_DSN)  # the database, with both schemas
        drop_tenant_db(b, ADMIN_DSN)  # B's role


def _migrate_to_18(t: TenantDB) -> None:
    """`t`'s schema as the runtime before this change left it: every migration up to 18, no task channel."""
    with connect(t.dsn, t.schema, autocommit=False) as c:
        schema_at_version(c, 18)
        c.commit()
        assert c.execute("SELECT to_regclass('task_channel')").fetchone() == (None,)


def _names_a_can_derive(b: TenantDB) -> set[str]:
    """Every channel name A could build from what it knows of B: its schema, role and database names."""
    known = {b.schema, b.role, b.dbname}
    names = {"agent_tasks", *known}
    for k in known:
        names |= {f"agent_tasks_{k}", f"agent_tasks:{k}", f"{k}_tasks",
                  f"agent_tasks_{hashlib.md5(k.encode()).hexdigest()}",  # noqa: S324 - what A could derive
                  f"agent_tasks_{hashlib.sha256(k.encode()).hexdigest()[:32]}"}
    return names


def _names_a_can_find(a_conn: psycopg.Connection) -> set[str]:
    """Every identifier-like word in what the server shows A's role of other sessions and objects: the queries
    in pg_stat_activity (B's host ran its LISTEN there), every comment, every column default."""
    texts = [r[0] for r in a_conn.execute(
        "SELECT query FROM pg_stat_activity WHERE query IS NOT NULL"
        " UNION ALL SELECT description FROM pg_description"
        " UNION ALL SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef").fetchall() if r[0]]
    return {w for text in texts for w in re.findall(r"[A-Za-z_][A-Za-z0-9_:]{2,62}", text)}


def test_another_tenants_role_hears_nothing_of_b_and_b_host_is_woken(two_tenants: tuple[TenantDB, TenantDB],
                                                                      tmp_path: Path, hosts: HostRunner) -> None:
    a, b = two_tenants
    _migrate_to_18(b)
    env = make_env(b, tmp_path / "b", AGENT_APP="tests.runtime.agents:AGENTS", AGENT_POLL_INTERVAL_S="10",
                   AGENT_HEARTBEAT_INTERVAL_S="10")
    hosts.start(env)
    hosts.wait_ready(env)  # it migrated B's schema to 19 at boot and LISTENs on B's channel
    with connect(a.dsn, a.schema, autocommit=True) as a_conn, \
            connect(b.dsn, b.schema, autocommit=True) as b_conn, \
            connect(b.dsn, b.schema, autocommit=True) as b_listener, \
            connect(a.dsn, a.schema, autocommit=True) as eavesdropper:
        assert migrate(a_conn, a.schema) == LATEST_VERSION
        b_channel, a_channel = tasks.notify_channel(b_conn), tasks.notify_channel(a_conn)
        assert re.fullmatch(r"agent_tasks_[0-9a-f]{32}", b_channel) and a_channel != b_channel

        # A cannot read B's channel name, nor find it anywhere the server shows A's role.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema"):
            a_conn.execute(sql.SQL("SELECT name FROM {}.task_channel").format(sql.Identifier(b.schema)))
        found = _names_a_can_find(a_conn)
        assert b_channel not in found
        assert b_channel not in _names_a_can_derive(b)

        candidates = _names_a_can_derive(b) | found | {a_channel}
        eavesdropper.execute(sql.SQL("; ").join(sql.SQL("LISTEN {}").format(sql.Identifier(n)) for n in candidates))
        b_listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(tasks.notify_channel(b_listener))))

        time.sleep(0.5)  # B's idle worker did its first look: the next is 10 s away unless it is woken
        took: dict[str, float] = {}
        t0 = time.monotonic()
        tid = tasks.submit(b_conn, "unstorable", {})
        assert wait_status(b, tid, ("done",), timeout=20) == "done"
        took["submit"] = time.monotonic() - t0
        t0 = time.monotonic()
        once, created = tasks.submit_once(b_conn, uuid.uuid4(), "unstorable", {})
        assert created
        assert wait_status(b, once.id, ("done",), timeout=20) == "done"
        took["submit_once"] = time.monotonic() - t0
        failed = uuid.uuid4()  # stopped short: inserted as failed, which notifies nobody
        b_conn.execute("INSERT INTO tasks (id, kind, status) VALUES (%s, 'unstorable', 'failed')", (failed,))
        t0 = time.monotonic()
        assert tasks.retry(b_conn, failed) is not None
        assert wait_status(b, failed, ("done",), timeout=20) == "done"
        took["retry"] = time.monotonic() - t0
        assert all(s < 1.0 for s in took.values()), f"B's idle host was not woken at once: {took}"

        heard_by_b = [(n.channel, n.payload) for n in b_listener.notifies(timeout=2.0, stop_after=3)]
        assert heard_by_b == [(b_channel, "")] * 3
        heard_by_a = [(n.channel, n.payload) for n in eavesdropper.notifies(timeout=1.0)]
        assert heard_by_a == [], f"A's role heard B's submits on {len(candidates)} channels: {heard_by_a}"

        # The eavesdropper could hear: A's own submit reaches it, on A's channel only, with nothing in it.
        tasks.submit(a_conn, "unstorable", {})
        assert [(n.channel, n.payload) for n in eavesdropper.notifies(timeout=2.0, stop_after=1)] == [(a_channel, "")]
        assert list(b_listener.notifies(timeout=0.5)) == []
