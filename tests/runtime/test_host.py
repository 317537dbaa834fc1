"""agent-host as a real process: demo job end to end, single writer, SIGTERM, hang detection, CLI submit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import ROOT, HostRunner, Sinks, TenantDB


def wait_status(t: TenantDB, task_id: uuid.UUID | str, statuses: tuple[str, ...], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    with connect(t.dsn, t.schema, autocommit=True) as c:
        while time.monotonic() < deadline:
            row = c.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()
            if row and row[0] in statuses:
                return str(row[0])
            time.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {statuses}")


def submit_cli(env: dict[str, str], kind: str, params: dict) -> str:
    out = subprocess.run([sys.executable, "-m", "agent_runtime.host", "submit", "--kind", kind,
                          "--params", json.dumps(params)], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=30, check=True)
    return str(uuid.UUID(out.stdout.strip()))


def test_demo_job_end_to_end(tenant_db: TenantDB, host_env: dict, hosts: HostRunner, sinks: Sinks) -> None:
    env = {**host_env, "AGENT_SMTP_URL": sinks.smtp_url, "AGENT_PAYMENTS_URL": sinks.payments_url}
    task_id = submit_cli(env, "demo", {"topic": "solar", "amount": 4200})
    proc = hosts.start(env)
    body = hosts.wait_ready(env)
    assert body["read_back"]["resumable"][0]["task"] == task_id
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "done"
    code, health = hosts.get(env, "/healthz")
    assert code == 200 and health["healthy"]
    assert len(sinks.emails()) == 1
    stats = sinks.payment_stats()
    assert stats["charges"] == 1 and stats["charge_list"][0]["params"]["amount"] == 4200
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        steps = [r[0] for r in c.execute("SELECT step FROM checkpoints WHERE task_id = %s ORDER BY seq",
                                         (task_id,))]
        assert steps == ["plan", "search", "write_files", "scan", "send_email", "pay", "snapshot"]
        snap = c.execute("SELECT snapshot_key FROM checkpoints WHERE task_id = %s AND step = 'snapshot'",
                         (task_id,)).fetchone()
        assert snap and snap[0].startswith(f"snapshots/task/{task_id}/")
    obj_root = Path(env["AGENT_OBJECTSTORE_URL"].removeprefix("file://"))
    assert (obj_root / snap[0]).is_file()
    assert b"Report on solar" not in (obj_root / snap[0]).read_bytes()  # encrypted at rest
    # SIGTERM: clean shutdown row, exit 0, within the grace period.
    t0 = time.monotonic()
    proc.kill(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < float(env["AGENT_GRACE_PERIOD_S"]) + 1
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        kinds = [r[0] for r in c.execute("SELECT kind FROM host_events ORDER BY id")]
    assert kinds == ["boot", "clean_shutdown"]
    for line in proc.output().splitlines():
        if line.startswith("{"):
            json.loads(line)  # structured logs
    assert "smtp-password" not in proc.output()


def test_second_host_refused(tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    first = hosts.start(host_env)
    hosts.wait_ready(host_env)
    env2 = dict(host_env, AGENT_VOLUME=host_env["AGENT_VOLUME"] + "-2")
    second = hosts.start(env2)
    assert second.wait(timeout=20) == 3
    assert "already running against schema" in second.output()
    assert first.p.poll() is None


def test_hang_makes_healthz_unhealthy_and_sigterm_abandons(tenant_db: TenantDB, host_env: dict,
                                                           hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_STEP_TIMEOUT_S="1.0", AGENT_GRACE_PERIOD_S="2", AGENT_APP="tests.runtime.agents:AGENTS")
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        task_id = tasks.submit(c, "demo", {"hang_step": "plan"})
    proc = hosts.start(env)
    hosts.wait_ready(env)
    code, body = hosts.get(env, "/healthz")
    assert code == 200, body
    deadline = time.monotonic() + 1.0 + 1.5
    while time.monotonic() < deadline:
        code, body = hosts.get(env, "/healthz")
        if code == 503:
            break
        time.sleep(0.1)
    assert code == 503 and "no progress" in body["reason"] and body["step"] == "plan"
    t0 = time.monotonic()
    proc.kill(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 2 + 1.0
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        events = [r[0] for r in c.execute("SELECT event FROM step_events WHERE task_id = %s ORDER BY id",
                                          (task_id,))]
        detail = c.execute("SELECT detail FROM host_events WHERE kind = 'clean_shutdown'").fetchone()
    assert events == ["start", "hung"]  # no progress for longer than the step timeout: it counts as an attempt
    assert detail and detail[0]["abandoned_step"] == "plan"


def test_bad_config_exits_nonzero(host_env: dict) -> None:
    env = dict(host_env, AGENT_OBJECT_KEY="bm90LTMyLWJ5dGVz")
    res = subprocess.run([sys.executable, "-m", "agent_runtime.host"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and "32 bytes" in res.stderr


def test_the_runtime_writes_only_into_its_own_schema_even_where_public_is_open(tenant_db: TenantDB) -> None:
    """The database isolation itself is provisioning's (tests/provisioning/test_tenant_database_isolation.py); what the
    runtime owes is never to write outside its schema. So this test opens `public` to everyone first: only
    the runtime's own search_path pinning can keep its tables out of there."""
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        admin.execute("GRANT CREATE, USAGE ON SCHEMA public TO PUBLIC")
        admin.execute(sql.SQL("ALTER ROLE {} RESET search_path").format(sql.Identifier(tenant_db.role)))
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        tasks.submit(c, "demo", {})
        c.execute("CREATE TABLE scratch (a int)")  # an unqualified name lands in the tenant schema
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        outside = admin.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE pg_get_userbyid(c.relowner) = %s AND n.nspname NOT IN (%s, 'pg_toast')",
            (tenant_db.role, tenant_db.schema)
        ).fetchall()
        inside = admin.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN ('tasks', 'effects', 'checkpoints', 'scratch')",
            (tenant_db.schema,)).fetchone()[0]
    assert outside == [] and inside == 4


def test_boot_blocks_unreadable_checkpoints_and_resumes_huge_conversation(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner, sinks: Sinks) -> None:
    from agent_runtime.state.checkpoints import CaseDelta, CheckpointStore
    from agent_runtime.state.memory import MemoryStore
    from agent_runtime.state.workspace import EMPTY_DIGEST

    env = {**host_env, "AGENT_SMTP_URL": sinks.smtp_url, "AGENT_PAYMENTS_URL": sinks.payments_url,
           "AGENT_MEMORY_TOKEN_BUDGET": "2000"}
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        mem = MemoryStore(c)
        with c.transaction():
            mem.append_many([("user", "y" * 400, {}) for _ in range(20000)])  # ~2M tokens vs 2k budget
        store = CheckpointStore(c)
        corrupt = tasks.submit(c, "demo", {})
        store.commit(corrupt, "plan", CaseDelta(done={"plan": 1}), workspace_digest=EMPTY_DIGEST, ledger_pos=0)
        c.execute("UPDATE case_entries SET value = '{\"forged\": true}' WHERE task_id = %s", (corrupt,))
        good = tasks.submit(c, "demo", {"search_s": 0})
    hosts.start(env)
    body = hosts.wait_ready(env)
    assert body["read_back"]["memory"]["rows_scanned"] <= 128
    assert body["read_back"]["memory"]["tokens"] <= 2000
    assert wait_status(tenant_db, good, ("done",)) == "done"
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        row = c.execute("SELECT status, blocked_reason, blocked_detail FROM tasks WHERE id = %s",
                        (corrupt,)).fetchone()
        ran = c.execute("SELECT count(*) FROM step_events WHERE task_id = %s", (corrupt,)).fetchone()[0]
    assert row[0] == "blocked" and row[1] == "corrupt_state" and "checksum" in row[2]
    assert ran == 0  # nothing of the corrupt task was executed
    assert hosts.get(env, "/healthz")[0] == 200
