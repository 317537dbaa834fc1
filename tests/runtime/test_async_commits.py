"""Which of a step's commits wait for the WAL flush (issue 39): the run's bookkeeping before the first irreversible
act ('running', the recorded configuration, the step's 'start') and an outcome the journal already holds commit
asynchronously; the effect's intent and the checkpoint stay synchronous, and the setting never outlives the
statement that made it (the next transaction on the same connection, or a caller's own transaction, keeps
synchronous_commit on).

The statements are read from libpq's protocol trace of a real run on a real tenant schema, not from our code."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.effects.base import LookupResult
from agent_runtime.errors import CorruptState
from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.checkpoints import CaseDelta
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore


class Charge:
    supports_lookup = False
    replay_safe = True

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": idem_key[-8:], "amount": args["amount"]}

    def lookup(self, idem_key: str) -> LookupResult:
        return LookupResult.unknown("keeps no record")


agent = Agent("async-commits")


@agent.step
def charge(ctx: Context) -> dict[str, Any]:
    return ctx.effect("charge", {"amount": 5})


def _runtime(conn: psycopg.Connection, tmp_path: Path) -> Runtime:
    tenant_id = str(uuid.uuid4())
    (tmp_path / "volume").mkdir(mode=0o700, exist_ok=True)
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), tenant_id)
    return Runtime(conn=conn, tenant_id=tenant_id, volume=tmp_path / "volume", store=store,
                   credentials=InMemoryCredentialSource(), effects={"charge": Charge()})


_PARSE = re.compile(r'\tF\t\d+\tParse\t "[^"]*" "(.*?)" \d', re.S)


def _statements(trace: Path) -> list[str]:
    """The text of every statement the connection parsed (a fresh connection parses each execution until
    psycopg's prepare threshold, so one run shows all of them)."""
    return [m.group(1) for m in _PARSE.finditer(trace.read_text("latin-1"))]


def _traced_run(conn: psycopg.Connection, rt: Any, task_id: Any, tmp_path: Path) -> list[str]:
    """Run the task to 'done' under libpq's protocol trace; the statements it parsed."""
    trace = tmp_path / "wire.trace"
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT, 0o600)
    conn.pgconn.trace(fd)
    conn.pgconn.set_trace_flags(psycopg.pq.Trace.REGRESS_MODE)
    try:
        assert run_task(rt, agent, task_id) == "done"
    finally:
        conn.pgconn.untrace()
        os.close(fd)
    return _statements(trace)


def _setting(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    assert row is not None
    return str(row[0])


def test_only_the_runs_bookkeeping_commits_without_waiting(conn: psycopg.Connection, tmp_path: Path) -> None:
    rt = _runtime(conn, tmp_path)
    task_id = tasks.submit(conn, agent.kind, {})
    statements = _traced_run(conn, rt, task_id, tmp_path)
    asynchronous = [s for s in statements if tasks.ASYNC_COMMIT in s]
    assert len(asynchronous) == 4, asynchronous
    assert "UPDATE tasks SET status = 'running'" in asynchronous[0]
    # The resume point is read in the same statement as the task: no statement of its own.
    assert "FROM checkpoints" in asynchronous[0]
    assert not [s for s in statements if s.startswith("SELECT") and "FROM checkpoints" in s], statements
    assert "agent_config" in asynchronous[1]
    assert "'start'" in asynchronous[2]
    # The outcome, which the journal holds durably before the row is written.
    assert asynchronous[3].startswith("UPDATE effects SET state")
    journal = rt.ledger.journal
    assert journal is not None
    effect = rt.ledger.for_task(task_id)[0]
    assert journal.get(effect.idem_key).state == "committed"  # type: ignore[union-attr]
    waiting = [s for s in statements if re.search(r"INTO effects|INTO checkpoints", s)]
    assert len(waiting) == 2, waiting  # the intent, the checkpoint
    assert not [s for s in waiting if "synchronous_commit" in s]
    # The setting ended with each statement's own transaction: the connection is back to the server's default.
    assert _setting(conn) == "on"
    with conn.transaction():
        assert _setting(conn) == "on"
    assert tasks.get(conn, task_id).status == "done"  # type: ignore[union-attr]


def test_the_setting_is_local_to_its_own_transaction(conn: psycopg.Connection) -> None:
    conn.execute(f"SELECT {tasks.ASYNC_COMMIT}")
    assert _setting(conn) == "on"
    with conn.transaction():
        conn.execute(f"SELECT {tasks.ASYNC_COMMIT}")
        assert _setting(conn) == "off"
    assert _setting(conn) == "on"


def test_without_a_journal_the_outcome_waits(conn: psycopg.Connection, tmp_path: Path) -> None:
    rt = _runtime(conn, tmp_path)
    rt.ledger.journal = None  # the table is then the outcome's only record
    task_id = tasks.submit(conn, agent.kind, {})
    outcome = [s for s in _traced_run(conn, rt, task_id, tmp_path) if s.startswith("UPDATE effects SET state")]
    assert len(outcome) == 1 and "synchronous_commit" not in outcome[0]


def test_a_callers_transaction_keeps_its_synchronous_commit(conn: psycopg.Connection) -> None:
    """Inside a caller's transaction the run's statements leave the setting alone: it would outlive them and
    make the caller's commit asynchronous."""
    task_id = tasks.submit(conn, agent.kind, {})
    with conn.transaction():
        started = tasks.start_run(conn, task_id)
        assert started is not None and started[0].status == "pending"
        tasks.config_record(conn, task_id, dict, read=False, recorded=None)
        assert _setting(conn) == "on"
    row = conn.execute("SELECT status, agent_config FROM tasks WHERE id = %s", (task_id,)).fetchone()
    assert row == ("running", {})


def test_the_run_reads_its_latest_checkpoint_with_the_task(conn: psycopg.Connection, tmp_path: Path) -> None:
    """`start_run` returns the task's latest checkpoint row (what `CheckpointStore.latest` reads), none before the
    first, and the row is checked like any other on decode."""
    rt = _runtime(conn, tmp_path)
    task_id = tasks.submit(conn, agent.kind, {})
    started = tasks.start_run(conn, task_id, with_checkpoint=True)
    assert started is not None and started[2] is None
    assert tasks.start_run(conn, task_id) is not None  # not asked for: no checkpoint column is read
    for seq in (1, 2):
        rt.checkpoints.commit(task_id, f"s{seq}", CaseDelta(), workspace_digest="d", ledger_pos=0, seq=seq)
    started = tasks.start_run(conn, task_id, with_checkpoint=True)
    assert started is not None and started[2] is not None
    assert rt.checkpoints.decode(started[2]) == rt.checkpoints.latest(task_id)
    assert rt.checkpoints.decode(started[2]).seq == 2
    conn.execute("UPDATE checkpoints SET ledger_pos = 7 WHERE task_id = %s AND seq = 2", (task_id,))
    started = tasks.start_run(conn, task_id, with_checkpoint=True)
    assert started is not None and started[2] is not None
    with pytest.raises(CorruptState, match="failed its checksum"):
        rt.checkpoints.decode(started[2])
