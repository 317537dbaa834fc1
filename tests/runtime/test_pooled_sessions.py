"""Pooled mode (AGENT_DATABASE_POOLED=1) through a real PgBouncer in transaction mode: the host holds no server
session (issue 16, item 1) and outlives restarts of the pooler.

The proof that nothing pins a session: the tenant's pool has ONE server connection while the host keeps three
client connections open (lease, worker, instance API). A session lock, an idle transaction, a LISTEN, a
temporary table or a prepared statement would either starve the other connections (the task would never
finish) or show in the server's catalogs, which are sampled while the host idles and while it works.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, Sinks, TenantDB, make_env, start_pgbouncer
from .test_host import submit_cli

TEST_AGENTS = "tests.runtime.agents:AGENTS"


def _server_sample(t: TenantDB) -> dict[str, Any]:
    """What the server holds for the tenant's role right now (read as the superuser, directly)."""
    with psycopg.connect(t.admin_dsn, autocommit=True) as admin:
        row = admin.execute(
            # A transaction left open, not a sample landing between two statements of one that is under way
            # (that moment shows "idle in transaction" too: seen once in a clean-clone CI run).
            "SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%%'"
            "                                  AND clock_timestamp() - state_change > interval '1 second'),"
            " (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            "   WHERE l.locktype = 'advisory' AND l.granted AND a.usename = %s),"
            " (SELECT count(*) FROM pg_class WHERE relpersistence = 't')"
            " FROM pg_stat_activity WHERE usename = %s", (t.role, t.role)).fetchone()
    assert row is not None
    return {"sessions": row[0], "idle_in_tx": row[1], "advisory_locks": row[2], "temp_tables": row[3]}


def _sample_while(t: TenantDB, done: threading.Event, out: list[dict[str, Any]]) -> None:
    while not done.is_set():
        out.append(_server_sample(t))
        time.sleep(0.05)


def _client_connections(pid: int, port: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections("tcp") if c.raddr and c.raddr.port == port
               and c.status == psutil.CONN_ESTABLISHED)


def test_a_pooled_host_holds_no_server_session_idle_or_working(tenant_db: TenantDB, hosts: HostRunner,
                                                               sinks: Sinks, tmp_path: Path) -> None:
    bouncer = start_pgbouncer(tenant_db, tmp_path / "pgbouncer", settings={"default_pool_size": 1,
                                                                           "server_idle_timeout": 1})
    try:
        env = make_env(tenant_db, tmp_path, AGENT_APP=TEST_AGENTS, AGENT_DATABASE_URL=bouncer.dsn(tenant_db),
                       AGENT_DATABASE_POOLED="1", AGENT_HEARTBEAT_INTERVAL_S="0.3",
                       AGENT_SMTP_URL=sinks.smtp_url, AGENT_PAYMENTS_URL=sinks.payments_url)
        host = hosts.start(env)
        hosts.wait_ready(env)
        tid = submit_cli(env, "demo", {"step_sleep_s": 0.2})  # the CLI too, through the pooler, no options
        hosts.get(env, "/readyz")  # and nothing the HTTP side does pins one either
        done, working = threading.Event(), []
        sampler = threading.Thread(target=_sample_while, args=(tenant_db, done, working))
        sampler.start()
        try:
            assert _wait_status(tenant_db, tid, ("done", "blocked", "failed"), timeout=60) == "done"
        finally:
            done.set()
            sampler.join()
        idle = [_server_sample(tenant_db) for _ in range(10) if time.sleep(0.1) is None]
        clients = _client_connections(host.p.pid, bouncer.port)
        assert clients >= 2  # the host keeps its client connections open...
        for sample in working + idle:  # ...and the server never holds more than the one pooled session
            assert sample["sessions"] <= 1 and sample["idle_in_tx"] == 0, sample
            assert sample["advisory_locks"] == 0 and sample["temp_tables"] == 0, sample
        assert max(s["sessions"] for s in working) == 1
        assert len(sinks.emails()) == 1 and sinks.payment_stats()["charges"] == 1
        print(f"\npooled host: {clients} client connections to PgBouncer, at most "
              f"{max(s['sessions'] for s in working + idle)} server session ({len(working)} samples while working)")
    finally:
        bouncer.stop()


def test_direct_host_holds_its_sessions_which_is_what_pooled_mode_removes(tenant_db: TenantDB,
                                                                           hosts: HostRunner, tmp_path: Path) -> None:
    """The anchor of the test above, so it measures what it says: the same host, direct, keeps two sessions
    (the session lock's and the worker's) for as long as it runs, idle or not."""
    env = make_env(tenant_db, tmp_path, AGENT_APP=TEST_AGENTS)
    hosts.start(env)
    hosts.wait_ready(env)
    time.sleep(0.5)
    sample = _server_sample(tenant_db)
    assert sample["sessions"] == 2 and sample["advisory_locks"] == 1, sample


def test_a_pooled_host_survives_pgbouncer_restarts_mid_task(tenant_db: TenantDB, hosts: HostRunner, sinks: Sinks,
                                                             tmp_path: Path) -> None:
    """SIGKILL, then SIGTERM (1.18: immediate shutdown), each with the pooler down for a second while the host
    works: the same process reconnects, the task finishes, each step and each effect happened once."""
    bouncer = start_pgbouncer(tenant_db, tmp_path / "pgbouncer")
    try:
        env = make_env(tenant_db, tmp_path, AGENT_APP=TEST_AGENTS, AGENT_DATABASE_URL=bouncer.dsn(tenant_db),
                       AGENT_DATABASE_POOLED="1", AGENT_HEARTBEAT_INTERVAL_S="0.3", AGENT_LEASE_TTL_S="5",
                       AGENT_SMTP_URL=sinks.smtp_url, AGENT_PAYMENTS_URL=sinks.payments_url)
        host = hosts.start(env)
        hosts.wait_ready(env)
        with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
            migrate(c, tenant_db.schema)
            tid = tasks.submit(c, "demo", {"step_sleep_s": 1.0, "search_s": 1.0})
        for sig, after_steps in ((signal.SIGKILL, 1), (signal.SIGTERM, 3)):
            deadline = time.monotonic() + 30
            while _done_steps(tenant_db, tid) < after_steps:
                assert time.monotonic() < deadline, host.output()[-3000:]
                time.sleep(0.05)
            bouncer.bouncer.restart(sig, down_s=1.0)
        assert _wait_status(tenant_db, tid, ("done", "blocked", "failed"), timeout=60) == "done", host.output()[-3000:]
        assert host.p.poll() is None  # the same process: it reconnected, it was not restarted
        assert "reconnected to the pooler" in host.output()
        with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
            done_steps = c.execute("SELECT step, count(*) FROM step_events WHERE task_id = %s AND event = 'done'"
                                   " GROUP BY step", (tid,)).fetchall()
            boots = c.execute("SELECT count(*) FROM host_events WHERE kind = 'boot'").fetchone()
        assert len(done_steps) == 7 and all(n == 1 for _s, n in done_steps), done_steps
        assert boots == (1,)
        assert len(sinks.emails()) == 1 and sinks.payment_stats()["charges"] == 1
        healthy = hosts.get(env, "/healthz")
        assert healthy[0] == 200, healthy
    finally:
        bouncer.stop()


def _done_steps(t: TenantDB, tid: object) -> int:
    with psycopg.connect(t.admin_dsn, autocommit=True) as admin:
        row = admin.execute(f'SELECT count(*) FROM "{t.schema}".step_events WHERE task_id = %s AND event = %s',
                            (tid, "done")).fetchone()
    return int(row[0]) if row else 0


def _wait_status(t: TenantDB, tid: object, statuses: tuple[str, ...], timeout: float) -> str:
    """As the superuser, directly: a tenant-role connection of the test's own would count as a session."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(t.admin_dsn, autocommit=True) as admin:
        while time.monotonic() < deadline:
            row = admin.execute(f'SELECT status FROM "{t.schema}".tasks WHERE id = %s', (tid,)).fetchone()
            if row and row[0] in statuses:
                return str(row[0])
            time.sleep(0.05)
    raise AssertionError(f"task {tid} never reached {statuses}")


def test_a_connection_with_a_command_still_in_flight_is_not_reused(tenant_db: TenantDB) -> None:
    """What the worker and lease loops ask before reconnecting. A pooler dying mid-query can leave libpq's
    connection "OK" with the query still marked in flight; every later command then fails with "another command
    is already in progress" and a loop that reconnects only a *closed* connection retries that forever (a CI
    run: the pooled host above spun for 30 s). Only an idle, open connection is reused."""
    from agent_runtime.db import reusable

    c = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    try:
        assert reusable(c)
        c.pgconn.send_query(b"SELECT pg_sleep(0.05)")  # in flight, as the dropped query was
        assert not reusable(c)
        try:
            c.execute("SELECT 1")
            raise AssertionError("libpq took a second command while one was in flight")
        except psycopg.OperationalError as exc:
            assert "another command is already in progress" in str(exc)
        assert not c.closed and not reusable(c)  # what the old check (closed) missed
        while c.pgconn.get_result() is not None:  # the first command's results drained: usable again
            pass
        assert reusable(c)
        with c.transaction():
            c.execute("SELECT 1")
            assert not reusable(c)  # mid-transaction: not handed on either
        assert reusable(c)
    finally:
        c.close()
    assert not reusable(c)
