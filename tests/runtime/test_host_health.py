"""Health covers the whole host: a host that lost its single-writer lock stops at once (a second host may
already be running), and a worker that dies is a crash (non-zero exit), never a clean shutdown."""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, TenantDB
from .test_host import wait_status


def test_a_host_whose_lock_session_is_terminated_stops_and_another_can_take_over(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_HEARTBEAT_INTERVAL_S="0.3")
    first = hosts.start(env)
    hosts.wait_ready(env)
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        pids = [r[0] for r in admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database ="
            " (SELECT oid FROM pg_database WHERE datname = current_database())")]
        assert len(pids) == 1  # the host's lock session
        admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
    t0 = time.monotonic()
    assert first.wait(timeout=10) == 6
    assert time.monotonic() - t0 < 3
    assert "single-writer lock lost" in first.output()
    second = hosts.start(env)
    assert hosts.wait_ready(env)["ready"] is True and second.p.poll() is None


def test_a_worker_that_dies_is_a_crash_not_a_clean_shutdown(tenant_db: TenantDB, host_env: dict,
                                                             hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP="tests.runtime.agents:AGENTS")
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        tasks.submit(c, "wrecker", {})
    proc = hosts.start(env)
    assert proc.wait(timeout=20) == 5
    assert "worker died: WorkerWrecked: simulated runtime bug" in proc.output()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        kinds = [r[0] for r in c.execute("SELECT kind FROM host_events ORDER BY id")]
    assert kinds == ["boot", "crash"]


def test_an_idle_worker_stalled_by_the_database_is_unhealthy_until_it_polls_again(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    """The lease renewal answers on its own connection while the worker's poll for tasks waits behind a lock:
    /healthz must see the worker's poll, not only the renewal."""
    env = dict(host_env, AGENT_APP="tests.runtime.agents:AGENTS", AGENT_HEARTBEAT_INTERVAL_S="0.5")
    bound = max(5.0, float(env["AGENT_POLL_INTERVAL_S"]) + 3 * 0.5)  # the host's poll bound, as documented
    proc = hosts.start(env)
    hosts.wait_ready(env)
    assert hosts.get(env, "/healthz")[0] == 200
    with psycopg.connect(tenant_db.admin_dsn) as admin:  # a transaction stays open until rollback
        admin.execute(sql.SQL("LOCK TABLE {}.tasks IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(tenant_db.schema)))
        t0 = time.monotonic()
        samples = []
        while time.monotonic() - t0 < bound + 3:
            code, body = hosts.get(env, "/healthz")
            samples.append(code)
            if code == 503:
                break
            time.sleep(0.1)
        unhealthy_after = time.monotonic() - t0
        assert code == 503, f"{len(samples)} samples, all {set(samples)}"
        assert "database" in body["reason"] and "poll" in body["reason"], body
        assert bound - 0.5 <= unhealthy_after <= bound + 1.5, unhealthy_after
        admin.rollback()
    t1 = time.monotonic()
    while hosts.get(env, "/healthz")[0] != 200:
        assert time.monotonic() - t1 < 3, "still unhealthy after the lock was released"
        time.sleep(0.05)
    print(f"/healthz 503 after {unhealthy_after:.2f}s (bound {bound}s), 200 again {time.monotonic() - t1:.2f}s "
          f"after the release")
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        tid = tasks.submit(c, "unstorable", {})
    assert wait_status(tenant_db, tid, ("done", "blocked", "failed")) == "done"  # the worker goes on
    assert proc.p.poll() is None
