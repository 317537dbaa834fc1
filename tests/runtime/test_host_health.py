"""Health covers the whole host: a host that lost its single-writer lock stops at once (a second host may
already be running), and a worker that dies is a crash (non-zero exit), never a clean shutdown."""

from __future__ import annotations

import time

import psycopg

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, TenantDB


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
