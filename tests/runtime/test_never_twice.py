"""Never twice, never lost: the black-box attacks that still broke exactly-once, each against real processes,
real SIGKILLs and real peers, counted at the peers' side.

1. A payments provider whose search lags and that ignores Idempotency-Key; the peer SIGKILLs the agent-host
   right after each charge's 200. On reboot the lookup says "absent" until the search catches up: the host
   must wait out the declared consistency window, never charge again.
2. The effect journal holds the outcome, the table still the intent (a kill between the two writes): boot
   settles it from the journal; no human is asked, the journal is not overwritten.
3. LangGraph: the tenant schema restored from a pg_dump taken before the payment, the thread run again: the
   journal (kept by TenantCheckpointer in the object store) answers; one charge.
4. Check, then use: the workspace restored under the release step after `require_judgment()` passed: the
   effect re-checks the verdict at its own moment and is blocked; the unscanned file is never sent.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from agent_runtime.crypto import decode_key
from agent_runtime.db import connect
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import EffectLedger, idempotency_key
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.errors import EffectInDoubt
from agent_runtime.integrations.langgraph import TenantCheckpointer, effect
from agent_runtime.state import tasks
from agent_runtime.state.objectstore import EncryptedObjectStore, ObjectStore, objectstore_from_url
from agent_runtime.state.workspace import restore_snapshot

from .conftest import HostRunner, Sinks, TenantDB, make_env, payment_adapter, start_sinks
from .test_host import wait_status
from .test_langgraph_attacks import payment_graph
from .test_ledger_journal import _dump, _restore
from .test_ledger_semantic_reasoning import _intent

APP = "tests.runtime.effect_agents:AGENTS"


def _objects(env: dict[str, str]) -> ObjectStore:
    """The instance's object store as its host opens it (same prefix, same data key)."""
    return EncryptedObjectStore(objectstore_from_url(env["AGENT_OBJECTSTORE_URL"]), decode_key(env["AGENT_OBJECT_KEY"]),
                                env["AGENT_TENANT_ID"])


def _statuses(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())


def test_kills_right_after_a_lagging_providers_200_never_charge_twice(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, tmp_path: Path) -> None:
    n = 30
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_EFFECT_RETRY_MAX_S="0.5",
                   AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S="3.5")
    pid_file = Path(env["AGENT_VOLUME"], ".host", "pid")
    # The search shows a charge 3 s after it was made: longer than a reboot takes, so "absent" is what a host
    # that trusts it at once would hear (and then charge again).
    peers = start_sinks(tmp_path / "peers", dedupe=False, payments_env={
        "AGENT_PAYMENTS_SEARCH_LAG_S": "3", "AGENT_PAYMENTS_KILL_PID_FILE": str(pid_file)})
    try:
        env["AGENT_PAYMENTS_URL"] = peers.payments_url
        ids = [tasks.submit(conn, "payer", {}) for _ in range(n)]
        kills, deadline = 0, time.monotonic() + 240
        while _statuses(conn).get("done", 0) < n:
            assert time.monotonic() < deadline, f"not done after {kills} kills: {_statuses(conn)}"
            proc = hosts.start(env)
            while proc.p.poll() is None and _statuses(conn).get("done", 0) < n:
                time.sleep(0.05)
            if proc.p.poll() is not None:
                assert proc.p.returncode == -9, proc.output()[-2000:]
                kills += 1
        stats = peers.payment_stats()
        keys = {idempotency_key(tid, "pay", "payment") for tid in ids}
        assert set(stats["charges_by_key"]) == keys
        doubles = {k: c for k, c in stats["charges_by_key"].items() if c != 1}
        assert doubles == {}, f"charged twice: {doubles}"
        assert stats["kills"] == kills == n  # every charge's 200 was followed by a SIGKILL of the host
        rows = conn.execute("SELECT state, split_part(resolution, ':', 1), count(*) FROM effects"
                            " GROUP BY 1, 2").fetchall()
        assert {state for state, _r, _c in rows} == {"committed"}
        # Settled by the provider's search once it could know, or from the journal when the kill came later.
        assert {how for _s, how, _c in rows} <= {"provider_lookup", "journal", "performed"}, rows
        assert _statuses(conn) == {"done": n}
    finally:
        peers.stop()


def test_an_outcome_in_the_journal_settles_the_effect_at_boot_without_a_human(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, sinks: Sinks, tmp_path: Path) -> None:
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_SMTP_URL=sinks.smtp_url)
    tid = tasks.submit(conn, "mailer", {})
    journal = EffectJournal(_objects(env))
    ledger = EffectLedger(conn, env["AGENT_TENANT_ID"], journal)
    args = {"from": "agent@t", "to": "ada@t", "subject": f"report {tid}", "body": "the report"}
    sent = ledger.run(tid, "send", "email", SmtpEffect(sinks.smtp_url), args)
    key = idempotency_key(tid, "send", "email")
    # What a SIGKILL between the journal's write and the table's leaves: the journal has the relay's 250, the
    # row is still the intent it was before the call (revision 1).
    rec = ledger.get(key)
    assert rec is not None and rec.state == "committed" and rec.revision == 2
    conn.execute("UPDATE effects SET state = 'intent', result = NULL, resolution = NULL, settled_at = NULL,"
                 " revision = 1, checksum = %s WHERE idem_key = %s", (rec.checksum_for("intent", None, None), key))
    hosts.start(env)
    body = hosts.wait_ready(env)
    assert body["read_back"]["resolved_effects"] == 1 and body["read_back"]["blocked_effects"] == 0
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done"
    assert len(sinks.emails()) == 1  # the relay got it once; nobody sent it again
    settled = ledger.get(key)
    assert settled is not None and (settled.state, settled.resolution) == ("committed", "journal:performed")
    assert settled.result == sent
    entry = journal.get(key)
    assert entry is not None and entry.state == "committed"  # never overwritten with 'blocked'
    assert conn.execute("SELECT blocked_reason FROM tasks WHERE id = %s", (tid,)).fetchone() == (None,)


def test_a_langgraph_payment_is_not_repeated_after_a_schema_restore(
        tenant_db: TenantDB, conn: psycopg.Connection, nodedupe: Sinks, tmp_path: Path) -> None:
    tenant_id = str(uuid.uuid4())
    objects = EncryptedObjectStore(objectstore_from_url(f"file://{tmp_path / 'objects'}/"), b"k" * 32, tenant_id)

    @tool
    def pay(amount: int, to: str) -> str:
        """Charge `amount` cents to `to`."""
        return str(effect("payment", {"amount": amount, "currency": "EUR", "to": to})["id"])

    def run_thread(c: psycopg.Connection) -> Any:
        saver = TenantCheckpointer(c, objects=objects, tenant_id=tenant_id,
                                   effects={"payment": payment_adapter(nodedupe.payments_url)})
        return payment_graph(pay, saver).invoke({"messages": [HumanMessage("pay acme")]},
                                                {"configurable": {"thread_id": "order-7"}})

    archive = tmp_path / "before-payment.dump"
    _dump(tenant_db, archive)  # the nightly backup, taken before the thread paid
    first = run_thread(conn)
    assert nodedupe.payment_stats()["charges"] == 1
    _restore(tenant_db, archive)  # the schema goes back: no checkpoint, no ledger row
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as fresh:
        assert fresh.execute("SELECT count(*) FROM effects").fetchone() == (0,)
        again = run_thread(fresh)
        row = fresh.execute("SELECT state, resolution FROM effects").fetchone()
    assert nodedupe.payment_stats()["charges"] == 1  # the provider was not asked again
    assert again["messages"][-1].content == first["messages"][-1].content  # the recorded charge, same id
    assert row == ("committed", "journal:performed")


def test_a_restore_racing_the_release_step_blocks_the_effect(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, sinks: Sinks, tmp_path: Path) -> None:
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_SMTP_URL=sinks.smtp_url)
    hold = tmp_path / "hold-release"
    hold.touch()
    control = tasks.submit(conn, "releaser", {"hold_file": str(tmp_path / "never")})
    hosts.start(env)
    hosts.wait_ready(env)
    assert wait_status(tenant_db, control, ("done", "blocked")) == "done"  # unraced, the release goes out once
    tid = tasks.submit(conn, "releaser", {"hold_file": str(hold)})
    deadline = time.monotonic() + 20
    while conn.execute("SELECT count(*) FROM step_events WHERE task_id = %s AND step = 'release' AND event = 'start'",
                       (tid,)).fetchone() != (1,):
        assert time.monotonic() < deadline, "the release step never started"
        time.sleep(0.05)
    time.sleep(0.3)  # require_judgment() has passed: the step is in its hold loop
    key, digest = conn.execute("SELECT object_key, digest FROM snapshots WHERE scope = %s ORDER BY id LIMIT 1",
                               (f"task/{tid}",)).fetchone()
    workdir = Path(env["AGENT_VOLUME"], "workspace", "tasks", str(tid))
    restore_snapshot(_objects(env), key, workdir, digest)  # the infected upload is back under the running step
    hold.unlink()
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "blocked"
    reason, detail = conn.execute("SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert reason == "judgment_invalid" and "scan" in detail
    subjects = [m["subject"] for m in sinks.emails()]
    assert subjects == [f"release {control}"]  # nothing went out for the restored, unscanned files
    assert conn.execute("SELECT count(*) FROM effects WHERE task_id = %s", (tid,)).fetchone() == (0,)


def test_a_lookup_endpoint_answering_404_is_cannot_tell_not_absent(runtime: Any, nodedupe: Sinks) -> None:
    """A provider with no such endpoint answers 404: that says nothing about the charge, which did land."""
    rt = runtime
    missing = f"{nodedupe.payments_url}/v1/charges/by-key/{{key}}"  # the peer has no such route: 404
    pay = payment_adapter(nodedupe.payments_url, lookup_url=missing)
    tid = tasks.submit(rt.conn, "payer", {})
    args = {"amount": 900, "currency": "EUR", "to": "acct_404"}
    key = _intent(rt, tid, "pay", "payment", args)
    pay.perform(key, args)  # the charge landed; the host died before recording it
    for _ in range(3):
        with pytest.raises(EffectInDoubt, match="could not say: lookup answered 404"):
            rt.ledger.run(tid, "pay", "payment", pay, args)
    assert nodedupe.payment_stats()["charges"] == 1  # asked again later, never charged again
    # A provider that documents 404 as "no record for this key" says so, and then it is "absent".
    documented = payment_adapter(nodedupe.payments_url, lookup_url=missing, lookup_absent_status=404)
    never = {"amount": 901, "currency": "EUR", "to": "acct_never"}
    key2 = _intent(rt, tid, "pay2", "payment", never)
    assert rt.ledger.run(tid, "pay2", "payment", documented, never)["idempotency_key"] == key2
    assert nodedupe.payment_stats()["charges"] == 2
