"""Thread policies where two writers meet (`agent_runtime.state.threads`), on real PostgreSQL with the real payment
peer: a rollback and a run's new effect intent are decided one after the other, never past each other (no charge
made for a run the thread forgot, no rollback over a charge), and two `reject` messages racing on an idle thread
let exactly one through. The end-to-end behaviour of each policy is tests/conversations/test_thread_policies.py."""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from typing import Any

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.errors import TaskBlocked
from agent_runtime.host.runner import Runtime
from agent_runtime.state import tasks as task_store
from agent_runtime.state import threads
from agent_runtime.state.memory import MemoryStore

from .conftest import Sinks, TenantDB


def _charges(sinks: Sinks) -> int:
    with urllib.request.urlopen(f"{sinks.payments_url}/stats", timeout=5) as resp:
        return int(json.loads(resp.read())["charges"])


def _running_message(conn: psycopg.Connection, thread: str, question: str) -> uuid.UUID:
    mid = uuid.uuid4()
    task_store.submit_once(conn, mid, "chat", {"thread": thread, "question": question, "message_id": str(mid)})
    MemoryStore(conn).in_thread(thread).append("user", question, {"task": str(mid), "message_id": str(mid)})
    task_store.set_status(conn, mid, "running")
    return mid


def _pay(rt: Runtime, task_id: uuid.UUID, out: dict[str, Any]) -> None:
    try:
        out["result"] = rt.ledger.run(task_id, "pay", "payment", rt.effects["payment"],
                                      {"amount": 500, "currency": "EUR", "to": "acct_race"})
    except TaskBlocked as exc:
        out["blocked"] = exc.reason


def test_a_rollback_holding_the_run_makes_its_new_intent_wait_and_then_not_happen(
        runtime: Runtime, tenant_db: TenantDB, sinks: Sinks) -> None:
    run = _running_message(runtime.conn, "t", "think")
    api = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    out: dict[str, Any] = {}
    with api.transaction():
        halted = threads.admit(api, "t", uuid.uuid4(), "rollback")
        assert [(h.task_id, h.status) for h in halted] == [(run, "rolled_back")]
        payer = threading.Thread(target=_pay, args=(runtime, run, out))
        payer.start()
        payer.join(1.0)
        assert payer.is_alive(), "the intent did not wait for the rollback deciding over its run"
    payer.join(10)
    assert out == {"blocked": "rolled_back"}
    assert _charges(sinks) == 0
    assert runtime.conn.execute("SELECT count(*) FROM effects WHERE task_id = %s", (run,)).fetchone() == (0,)
    # Nor in the journal: the intent created beside the refused INSERT (issue 39) was nobody's record and went.
    assert runtime.ledger.journal is not None
    assert runtime.ledger.journal.get(runtime.ledger.key_for(run, "pay", "payment")) is None
    assert not runtime.store.list("ledger/")
    # The discarded run's question is out of the thread's window; the log keeps it.
    assert MemoryStore(runtime.conn).in_thread("t").window(1000).messages == []
    assert [m.content for m in MemoryStore(runtime.conn).in_thread("t").range(0, 2**62)] == ["think"]
    api.close()


def test_a_rollback_after_the_run_paid_is_refused_and_changes_nothing(
        runtime: Runtime, tenant_db: TenantDB, sinks: Sinks) -> None:
    run = _running_message(runtime.conn, "t", "pay")
    out: dict[str, Any] = {}
    _pay(runtime, run, out)
    assert out["result"]["amount"] == 500 and _charges(sinks) == 1
    key = runtime.conn.execute("SELECT idem_key FROM effects WHERE task_id = %s", (run,)).fetchone()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as api:
        with pytest.raises(threads.RollbackRefused) as refused:
            with api.transaction():
                threads.admit(api, "t", uuid.uuid4(), "rollback")
        assert (refused.value.task_id, refused.value.idem_key, refused.value.state) == (run, key[0], "committed")
        # `interrupt` over the same run is allowed: it ends the run and keeps the effect.
        with api.transaction():
            assert [h.status for h in threads.admit(api, "t", uuid.uuid4(), "interrupt")] == ["interrupted"]
    assert task_store.get(runtime.conn, run).status == "interrupted"  # type: ignore[union-attr]
    again: dict[str, Any] = {}
    _pay(runtime, run, again)  # a replay of the step returns the recorded charge
    assert again["result"] == out["result"] and _charges(sinks) == 1


def test_two_rejects_racing_on_an_idle_thread_let_exactly_one_through(conn: psycopg.Connection,
                                                                      tenant_db: TenantDB) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    other = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    out: dict[str, Any] = {}

    def send_second() -> None:
        try:
            with other.transaction():
                threads.admit(other, "t", second, "reject")
                out["admitted"] = True
        except threads.ThreadBusy as exc:
            out["busy"] = exc.run.task_id

    with conn.transaction():
        assert threads.admit(conn, "t", first, "reject") == []
        task_store.submit_once(conn, first, "chat", {"thread": "t", "question": "a", "message_id": str(first)})
        racer = threading.Thread(target=send_second)
        racer.start()
        racer.join(1.0)
        assert racer.is_alive(), "the second message was decided before the first one was stored"
    racer.join(10)
    assert out == {"busy": first}
    other.close()
