"""Issue 32: the version policy per task, against real agent-host processes and two real releases.

Both releases install the same module (`refund_agent`) as the control plane installs wheels (a directory with the
package and its dist-info). A task starts on 1.0, the host is SIGKILLed in its second step, and a host on 2.0
takes over: by default the task finishes on 1.0 (in a child process on the release it started on, kept loadable
through AGENT_RELEASES_RETAINED); an agent that declares version_policy="compatible" continues on 2.0 and the
crossing is recorded; a release the instance cannot load blocks the task with its lever (Retry crosses, a host on
the task's release runs it again by itself). Each step's result names the release and the process that ran it.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from agent_runtime.db import connect

from .conftest import HostRunner, TenantDB
from .harness import Proc
from .test_host import wait_status
from .test_instance_api import Client, api_env
from .test_loader import make_distribution

REFUND = """
import os, time
from agent_runtime.sdk import Agent

agent = Agent("refund", version_policy={policy!r})

def _mark(ctx, step):
    return {{"step": step, "release": {version!r}, "pid": os.getpid()}}

@agent.step
def look_up(ctx):
    return _mark(ctx, "look_up")

@agent.step
def decide(ctx):
    # Holds until the test opens the gate: the host is killed in here.
    while not os.path.exists(ctx.params["gate"]):
        ctx.progress()
        time.sleep(0.05)
    return _mark(ctx, "decide")

@agent.step
def close(ctx):
    return _mark(ctx, "close")
"""


def _release(tmp: Path, version: str, policy: str = "pinned") -> dict[str, str]:
    site = make_distribution(tmp / f"release-{version}-{policy}", "refund-agent",
                             {"refund_agent": REFUND.format(version=version, policy=policy)},
                             {"refund": "refund_agent:agent"})
    digest = "sha256:" + (version.replace(".", "") + policy).encode().hex().ljust(64, "0")[:64]
    return {"version": version, "digest": digest, "path": str(site)}


def _env_on(base: dict[str, str], release: dict[str, str], *retained: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != "AGENT_APP"}
    env.update(AGENT_RELEASE_PATH=release["path"], AGENT_RELEASE_VERSION=release["version"],
               AGENT_RELEASE_DIGEST=release["digest"], PYTHONPATH=f"{base['PYTHONPATH']}:{release['path']}")
    if retained:
        env["AGENT_RELEASES_RETAINED"] = json.dumps(list(retained))
    return env


def _query(t: TenantDB, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        return [tuple(r) for r in c.execute(text, args).fetchall()]


def _steps(t: TenantDB, task_id: str) -> dict[str, dict[str, Any]]:
    return {key: value for key, value in _query(
        t, "SELECT key, value FROM case_entries WHERE task_id = %s AND kind = 'done'", task_id)}


def _wait_step_started(t: TenantDB, task_id: str, step: str, times: int = 1, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(_query(t, "SELECT 1 FROM step_events WHERE task_id = %s AND step = %s AND event = 'start'",
                     task_id, step)) < times:
        assert time.monotonic() < deadline, f"step {step} never started {times} time(s)"
        time.sleep(0.05)


def _start_on_v1_and_kill_in_decide(tenant_db: TenantDB, hosts: HostRunner, base: dict[str, str],
                                    v1: dict[str, str], gate: Path) -> str:
    env = _env_on(base, v1)
    host = _boot(hosts, env)
    task_id = str(uuid.uuid4())
    status, body = Client(hosts, env).call("POST", "/v1/tasks", {"id": task_id, "kind": "refund",
                                                                   "params": {"gate": str(gate)}})
    assert status in (200, 201), body
    _wait_step_started(tenant_db, task_id, "decide")
    host.kill(signal.SIGKILL)
    host.wait()
    return task_id


def _interrupted_on_v1(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner, v2_policy: str = "pinned",
                       ) -> tuple[dict[str, str], dict[str, str], dict[str, str], Path, str]:
    """Releases 1.0 and 2.0, and a task whose host on 1.0 was SIGKILLed in its 'decide' step: (the instance's
    environment without a release, 1.0, 2.0, the gate file 'decide' waits for, the task's id)."""
    base = api_env(tenant_db, tmp_path)
    v1, v2 = _release(tmp_path, "1.0"), _release(tmp_path, "2.0", v2_policy)
    gate = tmp_path / "gate"
    return base, v1, v2, gate, _start_on_v1_and_kill_in_decide(tenant_db, hosts, base, v1, gate)


def _boot(hosts: HostRunner, env: dict[str, str]) -> Proc:
    host = hosts.start(env)
    hosts.wait_ready(env)
    return host


def test_a_task_started_on_one_release_finishes_on_it_after_the_instance_moves_on(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    base, v1, v2, gate, task_id = _interrupted_on_v1(tenant_db, tmp_path, hosts)
    assert _query(tenant_db, "SELECT release FROM tasks WHERE id = %s", task_id) == [
        ({"version": "1.0", "digest": v1["digest"]},)]

    env = _env_on(base, v2, v1)
    host = _boot(hosts, env)
    # The 2.0 host runs the 1.0 task in a child process on 1.0, which holds in 'decide' until the gate opens.
    _wait_step_started(tenant_db, task_id, "decide", times=2)
    deadline = time.monotonic() + 20
    while not (children := psutil.Process(host.pid).children()):
        assert time.monotonic() < deadline, "no child process runs the pinned task"
        time.sleep(0.05)
    assert any("agent_runtime.host.pinned_child" in " ".join(c.cmdline()) for c in children)
    # What a pinned task costs: the new host's boot record to the child's start of the step (docs/releases.md).
    (cost,) = _query(tenant_db, "SELECT max(e.at) - (SELECT max(at) FROM host_events WHERE kind = 'boot')"
                                " FROM step_events e WHERE e.task_id = %s AND e.step = 'decide' AND e.event = 'start'",
                     task_id)[0]
    print(f"pinned child: boot to the step's start on the old release {cost.total_seconds():.2f} s")
    gate.touch()
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "done"
    steps = _steps(tenant_db, task_id)
    assert {s: v["release"] for s, v in steps.items()} == {"look_up": "1.0", "decide": "1.0", "close": "1.0"}
    assert steps["decide"]["pid"] != host.pid and steps["close"]["pid"] == steps["decide"]["pid"]
    assert not _query(tenant_db, "SELECT 1 FROM step_events WHERE task_id = %s AND event = 'release_crossed'",
                      task_id)
    done = _query(tenant_db, "SELECT step, count(*) FROM step_events WHERE task_id = %s AND event = 'done'"
                             " GROUP BY step", task_id)
    assert sorted(done) == [("close", 1), ("decide", 1), ("look_up", 1)]

    # A task started on 2.0 runs on 2.0, in the host itself.
    new_id = str(uuid.uuid4())
    assert Client(hosts, env).call("POST", "/v1/tasks", {"id": new_id, "kind": "refund",
                                                          "params": {"gate": str(gate)}})[0] in (200, 201)
    assert wait_status(tenant_db, new_id, ("done", "blocked", "failed")) == "done"
    assert {v["release"] for v in _steps(tenant_db, new_id).values()} == {"2.0"}
    assert {v["pid"] for v in _steps(tenant_db, new_id).values()} == {host.pid}


def test_an_agent_that_declares_its_steps_compatible_continues_on_the_new_release_and_the_crossing_is_recorded(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    base, v1, v2, gate, task_id = _interrupted_on_v1(tenant_db, tmp_path, hosts, "compatible")
    gate.touch()
    env = _env_on(base, v2, v1)  # 1.0 is kept loadable, but the 2.0 agent says it need not be used
    host = _boot(hosts, env)
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "done"
    steps = _steps(tenant_db, task_id)
    assert {s: v["release"] for s, v in steps.items()} == {"look_up": "1.0", "decide": "2.0", "close": "2.0"}
    assert steps["close"]["pid"] == host.pid
    crossed = _query(tenant_db, "SELECT error FROM step_events WHERE task_id = %s AND event = 'release_crossed'",
                     task_id)
    assert len(crossed) == 1 and "1.0" in crossed[0][0] and "2.0" in crossed[0][0] and "compatible" in crossed[0][0]
    assert _query(tenant_db, "SELECT release ->> 'version' FROM tasks WHERE id = %s", task_id) == [("2.0",)]


def test_a_release_the_instance_cannot_load_blocks_the_task_with_its_levers(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    base, v1, v2, gate, task_id = _interrupted_on_v1(tenant_db, tmp_path, hosts)
    gate.touch()

    env = _env_on(base, v2)  # 1.0 is not kept: the task cannot finish where it started
    host = _boot(hosts, env)
    assert wait_status(tenant_db, task_id, ("blocked", "done")) == "blocked"
    (reason, detail), = _query(tenant_db, "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", task_id)
    assert reason == "release_unavailable" and "release 1.0" in detail and "Retry" in detail, detail
    assert v1["path"] not in detail and str(tmp_path) not in detail  # named by version and digest, not by path
    assert set(_steps(tenant_db, task_id)) == {"look_up"}  # nothing of 1.0's task ran on 2.0

    # The instance back on 1.0 (a rollback) runs it again by itself, on 1.0.
    host.stop()
    env = _env_on(base, v1)
    _boot(hosts, env)
    assert wait_status(tenant_db, task_id, ("done", "blocked")) == "done"
    assert {v["release"] for v in _steps(tenant_db, task_id).values()} == {"1.0"}


def test_retry_continues_a_task_on_the_release_the_instance_runs_recorded_as_a_crossing(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    base, v1, v2, gate, task_id = _interrupted_on_v1(tenant_db, tmp_path, hosts)
    gate.touch()
    env = _env_on(base, v2)
    _boot(hosts, env)
    assert wait_status(tenant_db, task_id, ("blocked", "done")) == "blocked"
    code, body = Client(hosts, env).call("POST", f"/v1/tasks/{task_id}/retry")
    assert code == 200, body
    assert wait_status(tenant_db, task_id, ("done",)) == "done"
    assert {s: v["release"] for s, v in _steps(tenant_db, task_id).items()} == {
        "look_up": "1.0", "decide": "2.0", "close": "2.0"}
    crossed = _query(tenant_db, "SELECT error FROM step_events WHERE task_id = %s AND event = 'release_crossed'",
                     task_id)
    assert len(crossed) == 1 and "retried by an operator" in crossed[0][0], crossed


def test_the_pinned_child_dies_with_its_host_and_the_next_host_finishes_the_task_once(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    base, v1, v2, gate, task_id = _interrupted_on_v1(tenant_db, tmp_path, hosts)
    env = _env_on(base, v2, v1)
    host = _boot(hosts, env)
    deadline = time.monotonic() + 20
    while not (children := psutil.Process(host.pid).children()):
        assert time.monotonic() < deadline, "no child process runs the pinned task"
        time.sleep(0.05)
    child = children[0]
    host.kill(signal.SIGKILL)
    host.wait()
    # Killed with the host (PR_SET_PDEATHSIG): no orphan keeps stepping beside the next host.
    gone, alive = psutil.wait_procs([child], timeout=5)
    assert gone and not alive, f"the pinned child {child.pid} outlived its host"

    gate.touch()
    host = _boot(hosts, env)
    assert wait_status(tenant_db, task_id, ("done", "blocked", "failed")) == "done"
    assert {v["release"] for v in _steps(tenant_db, task_id).values()} == {"1.0"}
    done = _query(tenant_db, "SELECT step, count(*) FROM step_events WHERE task_id = %s AND event = 'done'"
                             " GROUP BY step", task_id)
    assert sorted(done) == [("close", 1), ("decide", 1), ("look_up", 1)]
