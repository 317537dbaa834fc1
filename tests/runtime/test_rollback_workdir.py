"""A run rolled back by a new message (thread policy `rollback`) while the host is killed inside its step: the step
boundary that would have removed its working directory never comes, so the next boot removes it (the run never
resumes: its files are discarded, uncommitted work). Other runs' directories are kept: an interrupted run's (what
it committed stays) and a finished one's. Real agent-host processes and a real SIGKILL."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg

from agent_runtime.state import tasks as task_store
from agent_runtime.state import threads

from .conftest import HostRunner, TenantDB, make_env
from .test_host import wait_status

APP = "tests.runtime.effect_agents:AGENTS"


def _message_run(conn: psycopg.Connection, thread: str, hold: Path) -> uuid.UUID:
    mid = uuid.uuid4()
    task_store.submit_once(conn, mid, "drafter", {"thread": thread, "question": f"q-{mid.hex[:6]}",
                                                   "message_id": str(mid), "hold_file": str(hold)})
    return mid


def _wait_file(path: Path, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_a_run_rolled_back_while_its_host_was_killed_has_its_workdir_removed_at_the_next_boot(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, tmp_path: Path) -> None:
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_STEP_MAX_ATTEMPTS="10")
    tasks_dir = Path(env["AGENT_VOLUME"], "workspace", "tasks")
    free, hold = tmp_path / "never", tmp_path / "hold"
    hold.touch()
    finished = _message_run(conn, "done-thread", free)  # a run that ends normally: its files stay
    # An interrupted run whose host is killed before its step boundary keeps its files: what it did stays.
    kept = _message_run(conn, "support-2", hold)
    host = hosts.start(env)
    assert wait_status(tenant_db, finished, ("done",)) == "done"
    _wait_file(tasks_dir / str(kept) / "draft.txt")
    with conn.transaction():
        threads.admit(conn, "support-2", uuid.uuid4(), "interrupt")
    host.kill()
    host.wait()
    # A run rolled back by a new message (what the instance API does in its transaction), the host killed before
    # the run reaches its next step boundary.
    doomed = _message_run(conn, "support-1", hold)
    host = hosts.start(env)
    assert hosts.wait_ready(env)["read_back"]["discarded_workdirs"] == 0
    _wait_file(tasks_dir / str(doomed) / "draft.txt")
    with conn.transaction():
        ended = threads.admit(conn, "support-1", uuid.uuid4(), "rollback")
    assert [(r.task_id, r.status) for r in ended] == [(doomed, "rolled_back")]
    host.kill()
    host.wait()
    assert (tasks_dir / str(doomed) / "draft.txt").exists()  # left behind by the kill
    (tasks_dir / "not-a-task").mkdir()  # a directory that names no task is not the host's to remove

    hosts.start(env)
    body = hosts.wait_ready(env)
    assert body["read_back"]["discarded_workdirs"] == 1
    assert not (tasks_dir / str(doomed)).exists()
    assert (tasks_dir / str(kept) / "draft.txt").exists()
    assert (tasks_dir / str(finished) / "draft.txt").exists()
    assert (tasks_dir / "not-a-task").is_dir()
    status = conn.execute("SELECT id, status FROM tasks WHERE id = ANY(%s)", ([doomed, kept],)).fetchall()
    assert dict(status) == {doomed: "rolled_back", kept: "interrupted"}  # neither resumed
    hold.unlink()
