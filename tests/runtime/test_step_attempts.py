"""Planned stops never strand work, and poison steps are counted whatever ended their attempts (an error,
a crash, a hang): real agent-host processes, real signals."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, TenantDB
from .test_host import wait_status

TEST_AGENTS = "tests.runtime.agents:AGENTS"


def _events(t: TenantDB, task_id: object) -> list[tuple[str, str]]:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        return [(r[0], r[1]) for r in c.execute(
            "SELECT step, event FROM step_events WHERE task_id = %s ORDER BY id", (task_id,))]


def _submit(t: TenantDB, kind: str, params: dict) -> object:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        migrate(c, t.schema)
        return tasks.submit(c, kind, params)


def test_a_step_abandoned_at_sigterm_reruns_on_the_next_boot_whatever_it_wrote(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    env = dict(host_env, AGENT_APP=TEST_AGENTS, AGENT_GRACE_PERIOD_S="1")
    task_id = _submit(tenant_db, "holder", {"hold_file": str(hold)})
    for _ in range(4):  # four deploys in a row, each in the middle of the step: never counted against it
        proc = hosts.start(env)
        hosts.wait_ready(env)
        deadline = time.monotonic() + 10
        while ("write_then_hold", "start") not in _events(tenant_db, task_id)[-1:]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)
        proc.kill(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    events = _events(tenant_db, task_id)
    assert events.count(("write_then_hold", "abandoned")) == 4 and ("write_then_hold", "hung") not in events
    hold.unlink()
    hosts.start(env)
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "done"
    assert _events(tenant_db, task_id)[-3:] == [("write_then_hold", "done"), ("finish", "start"), ("finish", "done")]


def test_a_step_that_kills_its_process_is_blocked_as_poison_after_max_attempts(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP=TEST_AGENTS, AGENT_STEP_MAX_ATTEMPTS="3")
    task_id = _submit(tenant_db, "crasher", {})
    boots = 0
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        while boots < 6:
            proc = hosts.start(env)
            boots += 1
            deadline = time.monotonic() + 20
            while proc.p.poll() is None and time.monotonic() < deadline:
                status = c.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()[0]
                if status == "blocked":
                    break
                time.sleep(0.05)
            status, reason, detail = c.execute(
                "SELECT status, blocked_reason, blocked_detail FROM tasks WHERE id = %s", (task_id,)).fetchone()
            if status == "blocked":
                break
            assert proc.wait(timeout=10) == -signal.SIGKILL
    assert (status, reason) == ("blocked", "poison_step")
    assert "step 'die' was attempted 3 times" in detail and "start, start, start" in detail
    assert boots == 4  # three attempts died with their process; the fourth boot refused a fourth attempt
    assert _events(tenant_db, task_id) == [("die", "start")] * 3


def test_errors_count_too_and_a_step_declares_its_own_limit(tenant_db: TenantDB, host_env: dict,
                                                            hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP=TEST_AGENTS, AGENT_STEP_MAX_ATTEMPTS="5")
    task_id = _submit(tenant_db, "failer", {})
    hosts.start(env)
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "blocked"
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        reason, detail = c.execute("SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s",
                                   (task_id,)).fetchone()
    assert reason == "poison_step" and "failed 2 times" in detail and "this step always fails" in detail
    assert _events(tenant_db, task_id) == [("fail", "start"), ("fail", "failed")] * 2  # @step(max_attempts=2)
