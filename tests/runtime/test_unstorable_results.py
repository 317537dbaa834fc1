"""A step result (or case-file note) the database cannot store fails that step once and blocks its task
(`unstorable_result`); the instance stays up and the tenant's other tasks run: a real agent-host process."""

from __future__ import annotations

import time

import pytest

from agent_runtime.db import connect
from agent_runtime.host import runner
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .agents import unstorable
from .conftest import HostRunner, TenantDB
from .test_host import wait_status

TEST_AGENTS = "tests.runtime.agents:AGENTS"

# (task parameters, what the block's detail must name)
BAD = {
    "nan": ({"bad": "nan"}, "a float nan (not valid JSON) at $"),
    "surrogate": ({"bad": "surrogate"}, "a string with a lone surrogate at offset 0 at $"),
    "nul": ({"bad": "nul"}, "a string with a NUL character at offset 1 at $.text"),
    "object": ({"bad": "object"}, "an object of type set at $.items"),
    "note": ({"bad": "nan", "as_note": True}, "case-file note 'score' cannot be stored: a float nan"),
}


def test_an_unstorable_result_blocks_its_task_once_and_the_host_stays_up(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP=TEST_AGENTS)
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        bad = {name: tasks.submit(c, "unstorable", params) for name, (params, _) in BAD.items()}
        normal = tasks.submit(c, "unstorable", {})  # submitted last: runs after every bad one
    proc = hosts.start(env)
    hosts.wait_ready(env)
    assert wait_status(tenant_db, normal, ("done", "blocked", "failed")) == "done"
    for tid in bad.values():
        wait_status(tenant_db, tid, ("done", "blocked", "failed"))
    time.sleep(0.5)  # a crash would show by now
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        for name, tid in bad.items():
            status, reason, detail = c.execute(
                "SELECT status, blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
            assert (status, reason) == ("blocked", "unstorable_result"), name
            assert detail.startswith("step 'emit': ") and BAD[name][1] in detail, detail
            events = c.execute("SELECT step, event FROM step_events WHERE task_id = %s ORDER BY id",
                               (tid,)).fetchall()
            assert events == [("prepare", "start"), ("prepare", "done"), ("emit", "start"), ("emit", "failed")]
        assert c.execute("SELECT count(*) FROM case_entries WHERE key = 'score' OR (kind = 'done' AND key = 'emit'"
                         " AND task_id <> %s)", (normal,)).fetchone()[0] == 0
        host_events = c.execute("SELECT kind, detail->>'pid' FROM host_events ORDER BY id").fetchall()
    assert host_events == [("boot", str(proc.p.pid))]  # one boot, by this very process: never restarted
    assert proc.p.poll() is None
    code, body = hosts.get(env, "/healthz")
    assert code == 200, body


def test_a_value_the_database_refuses_past_the_check_blocks_the_same_way(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database's own refusal (here NaN, with the check switched off) is caught around the commit."""
    monkeypatch.setattr(runner, "unstorable", lambda value: None, raising=False)
    rt = runtime
    tid = tasks.submit(rt.conn, "unstorable", {"bad": "nan"})
    assert run_task(rt, unstorable, tid) == "blocked"
    task = tasks.get(rt.conn, tid)
    assert task is not None and task.blocked_reason == "unstorable_result"
    assert task.blocked_detail is not None
    assert task.blocked_detail.startswith("step 'emit': the database refused to store its result")
    assert "22P02" in task.blocked_detail and "NaN" not in task.blocked_detail
    assert rt.conn.execute("SELECT step, event FROM step_events WHERE task_id = %s ORDER BY id", (tid,)
                           ).fetchall()[-2:] == [("emit", "start"), ("emit", "failed")]
    assert rt.conn.execute("SELECT count(*) FROM checkpoints WHERE task_id = %s AND step = 'emit'", (tid,)
                           ).fetchone()[0] == 0
    rt.conn.execute("SELECT 1")  # the connection is usable: the failed transaction was rolled back
