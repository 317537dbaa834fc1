"""Crash at any point: demo jobs, each with a SIGKILL of agent-host at a random moment and a restart.

`test_sigkill_at_random_moments`: 50 jobs against the sinks (the payments peer de-duplicating by key); every
job must finish, no completed step may run again, every effect must happen exactly once at the sinks, a
search whose result was cached must never be paid for again. The relay is a standard one, so an email caught
by a kill is blocked for a human: the test decides it as an operator would, from the relay's log.

`test_sigkill_with_standard_providers`: the standard relay (no private SMTP command, no lookup: an email whose
outcome is unknown must wait for a human) and a payments provider that ignores the Idempotency-Key (only the
ledger and its search lookup stand between a crash and a second charge); kills are biased towards the email
and payment steps. Each task ends done with exactly one delivery per email and one charge, or blocked in
doubt for a human with at most one delivery of the email in doubt; never two of anything.

Random kills land inside a few-millisecond provider call only by luck, so each test also has a forced round:
the provider is stopped (SIGSTOP) so the call hangs right after its intent was committed, agent-host is
SIGKILLed there and the provider resumed; the in-doubt path is asserted, not just printed.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from agent_runtime.db import connect
from agent_runtime.effects.ledger import EffectLedger, idempotency_key
from agent_runtime.effects.smtp import message_id_for
from agent_runtime.host.config import HostConfig
from agent_runtime.host.process import Host
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from agent_runtime.state.toolcache import ToolCache

from .conftest import HostRunner, Proc, Sinks, TenantDB, make_env, start_sinks
from .harness import request_queued_at

RUNS = 50
STANDARD_RUNS = 34  # + 2 forced rounds = 36 SIGKILLs
DEMO_STEPS = 7


def _wait_settled(conn: psycopg.Connection, tid: UUID, host: Proc, what: str, timeout_s: float = 30) -> str:
    """Poll until the task is done, blocked or failed; a task left running or pending is stranded."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = conn.execute("SELECT status FROM tasks WHERE id = %s", (tid,)).fetchone()
        if row and row[0] in ("done", "blocked", "failed"):
            return str(row[0])
        assert time.monotonic() < deadline, f"{what} never finished:\n{host.output()[-3000:]}"
        time.sleep(0.02)


def _wait_row(conn: psycopg.Connection, query: str, params: tuple[Any, ...], host: Proc, what: str,
              timeout_s: float = 20) -> None:
    """Tight poll (1 ms) for a row: kills keyed to a step or an intent must follow it closely."""
    deadline = time.monotonic() + timeout_s
    while conn.execute(query, params).fetchone() is None:
        assert time.monotonic() < deadline, f"never saw {what}:\n{host.output()[-3000:]}"
        time.sleep(0.001)


def _kill_inside_perform(conn: psycopg.Connection, host: Proc, provider: Proc, effect: str,
                         params: dict[str, Any], request_to_port: int | None = None,
                         before_restart: Callable[[], None] = lambda: None) -> UUID:
    """SIGKILL agent-host deterministically inside `effect`'s provider call.

    The provider is stopped, so the kernel still accepts the connection but nothing answers: the call hangs
    after the ledger committed its intent. agent-host is killed once that intent row is visible (and, with
    `request_to_port`, once the whole request sits at the provider: the intent commits before the request is
    sent), then the provider resumes and handles whatever the dead client had sent. The caller restarts the
    host after `before_restart`, which may wait for the provider to have acted.
    """
    provider.kill(signal.SIGSTOP)
    try:
        tid = tasks.submit(conn, "demo", params)
        _wait_row(conn, "SELECT 1 FROM effects WHERE task_id = %s AND effect = %s AND state = 'intent'",
                  (tid, effect), host, f"an intent for {effect}")
        deadline = time.monotonic() + 10
        while request_to_port is not None and not request_queued_at(request_to_port):
            assert time.monotonic() < deadline, f"the {effect} request never reached port {request_to_port}"
            time.sleep(0.001)
        host.kill(signal.SIGKILL)
        host.wait(timeout=10)
    finally:
        provider.kill(signal.SIGCONT)
    before_restart()
    return tid


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _wait_for_posts(sinks: Sinks, n: int) -> Callable[[], None]:
    """Until the payments peer has handled `n` POSTs: the orphaned charge lands before the host's lookup."""
    def wait() -> None:
        deadline = time.monotonic() + 10
        while sinks.payment_stats()["posts"] < n:
            assert time.monotonic() < deadline, "the payments peer never handled the orphaned charge"
            time.sleep(0.01)
    return wait


def _instance_ledger(conn: psycopg.Connection, env: dict[str, str]) -> EffectLedger:
    """The ledger exactly as the instance builds it (with its effect journal): a decision recorded without
    the journal would be taken for a rewound table and undone at the next replay."""
    return Host(HostConfig.from_env(env)).build_runtime(conn).ledger


def _decide_as_operator(conn: psycopg.Connection, ledger: EffectLedger, sinks: Sinks, tid: UUID) -> int:
    """What an operator does with a task blocked on an email in doubt: look its Message-ID up in the relay's
    log, then record that it was sent or order it sent. Returns how many effects were decided."""
    row = conn.execute("SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert row is not None and row[0] == "effect_in_doubt", row
    in_doubt = [r for r in ledger.for_task(tid) if r.state == "blocked"]
    assert [r.effect for r in in_doubt] == ["email"], in_doubt  # payments have a lookup: never a human's
    sent = {e["message_id"] for e in sinks.emails()}
    for rec in in_doubt:
        mid = message_id_for(rec.idem_key)
        ledger.decide(rec.idem_key, performed=mid in sent, result={"message_id": mid, "refused": []},
                      decided_by="operator")
    return len(in_doubt)


def _steps_run_twice(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT d.task_id, d.step FROM step_events d JOIN step_events s"
        " ON s.task_id = d.task_id AND s.step = d.step AND s.event = 'start' AND s.id > d.id"
        " WHERE d.event = 'done'").fetchall()


def test_sigkill_at_random_moments(module_tenant_db: TenantDB, tmp_path: Path) -> None:
    t = module_tenant_db
    sinks = start_sinks(tmp_path / "sinks")
    runner = HostRunner(tmp_path)
    search_log = tmp_path / "search.jsonl"
    env = make_env(t, tmp_path, AGENT_SMTP_URL=sinks.smtp_url, AGENT_PAYMENTS_URL=sinks.payments_url,
                   AGENT_DEMO_SEARCH_LOG=str(search_log), AGENT_POLL_INTERVAL_S="0.02")
    rng = random.Random(20240611)
    conn = connect(t.dsn, t.schema, autocommit=True)
    migrate(conn, t.schema)
    operator_ledger = _instance_ledger(conn, env)
    task_ids = []
    kills_while_unfinished = decided = 0
    try:
        host = runner.start(env)
        for i in range(RUNS):
            tid = tasks.submit(conn, "demo", {"topic": f"topic-{i}", "amount": 100 + i, "search_s": 0.04,
                                              "step_sleep_s": 0.02})
            task_ids.append(tid)
            time.sleep(rng.uniform(0.0, 0.45))
            host.kill(signal.SIGKILL)
            host.wait(timeout=10)
            row = conn.execute("SELECT status FROM tasks WHERE id = %s", (tid,)).fetchone()
            kills_while_unfinished += row is not None and row[0] != "done"
            host = runner.start(env)
            status = _wait_settled(conn, tid, host, f"run {i}")
            if status == "blocked":
                decided += _decide_as_operator(conn, operator_ledger, sinks, tid)
                status = _wait_settled(conn, tid, host, f"run {i} after the operator's decision")
            assert status == "done", (status, conn.execute("SELECT blocked_reason, blocked_detail FROM tasks"
                                                           " WHERE id = %s", (tid,)).fetchone())
        # --- forced: killed inside the email (the operator decides) and the payment (the search decides) ---
        tid = _kill_inside_perform(conn, host, sinks.procs[0], "email", {"topic": "forced-email", "search_s": 0.0})
        task_ids.append(tid)
        host = runner.start(env)
        assert _wait_settled(conn, tid, host, "the forced email round") == "blocked"
        decided += _decide_as_operator(conn, operator_ledger, sinks, tid)
        assert _wait_settled(conn, tid, host, "the forced email round, decided") == "done"
        forced = conn.execute("SELECT resolution FROM effects WHERE task_id = %s AND effect = 'email'",
                              (tid,)).fetchone()
        assert forced is not None and forced[0] == "human:retry:performed", forced  # it had never reached the relay
        posts = sinks.payment_stats()["posts"]
        tid = _kill_inside_perform(conn, host, sinks.procs[1], "payment",
                                   {"topic": "forced", "amount": 99, "search_s": 0.0},
                                   request_to_port=_port(sinks.payments_url),
                                   before_restart=_wait_for_posts(sinks, posts + 1))
        task_ids.append(tid)
        kills_while_unfinished += 2
        host = runner.start(env)
        assert _wait_settled(conn, tid, host, "the forced payment round") == "done"
        forced = conn.execute("SELECT resolution FROM effects WHERE task_id = %s AND effect = 'payment'",
                              (tid,)).fetchone()
        assert forced is not None and forced[0] == "provider_lookup:found", forced

        # --- no completed step ran twice -------------------------------------------------------
        assert _steps_run_twice(conn) == []
        done_counts = conn.execute(
            "SELECT count(*) FILTER (WHERE event = 'done'), count(DISTINCT (task_id, step)),"
            " count(*) FILTER (WHERE event = 'start') FROM step_events").fetchone()
        assert done_counts[0] == done_counts[1] == len(task_ids) * DEMO_STEPS
        # --- effects exactly once --------------------------------------------------------------
        subjects = Counter(e["subject"] for e in sinks.emails())
        assert all(subjects[f"Report {tid}"] == 1 for tid in task_ids), subjects
        assert sum(subjects.values()) == len(task_ids)
        stats = sinks.payment_stats()
        assert stats["charges"] == len(task_ids) and set(stats["charges_by_key"].values()) == {1}
        assert stats["replays"] == 0  # the provider never even saw a second attempt
        resolved = conn.execute("SELECT count(*) FROM effects WHERE resolution LIKE 'provider_lookup%%'").fetchone()
        assert resolved is not None and resolved[0] >= 1 and decided >= 1  # in-doubt paths taken, not just possible
        # --- cached tool calls not paid twice --------------------------------------------------
        calls = [json.loads(line) for line in search_log.read_text().splitlines()]
        rows = conn.execute("SELECT tool, args_hash, extract(epoch FROM created_at) FROM tool_cache").fetchall()
        cached_at = {h: float(ts) for _tool, h, ts in rows}
        paid_after_cached = [c for c in calls if c["t"] > cached_at.get(ToolCache.args_hash({"q": c["q"]}), 1e20)]
        assert paid_after_cached == []
        distinct = len({c["q"] for c in calls})
        assert distinct == len(task_ids) * 2
        print(f"\ncrash suite: runs={len(task_ids)} kills_mid_job={kills_while_unfinished} host_starts={runner.n}"
              f" steps_done={done_counts[0]} step_starts={done_counts[2]} emails={sum(subjects.values())}"
              f" charges={stats['charges']} provider_replays={stats['replays']}"
              f" in_doubt_resolved_by_lookup={resolved[0]} emails_in_doubt_decided_by_operator={decided}"
              f" searches_paid={len(calls)} distinct_searches={distinct}"
              f" repaid_interrupted_before_cache={len(calls) - distinct} paid_after_cached=0")
        assert kills_while_unfinished >= RUNS // 2  # the kills really landed mid-job
    finally:
        conn.close()
        runner.stop_all()
        sinks.stop()


def test_sigkill_with_standard_providers(tenant_db: TenantDB, tmp_path: Path) -> None:
    t = tenant_db
    sinks = start_sinks(tmp_path / "sinks", dedupe=False)
    smtp_peer, payments_peer = sinks.procs
    runner = HostRunner(tmp_path)
    env = make_env(t, tmp_path, AGENT_SMTP_URL=sinks.smtp_url, AGENT_PAYMENTS_URL=sinks.payments_url,
                   AGENT_POLL_INTERVAL_S="0.02")
    rng = random.Random(20261201)
    conn = connect(t.dsn, t.schema, autocommit=True)
    migrate(conn, t.schema)
    cc = ["cc1@tenant.test", "cc2@tenant.test"]  # three emails in one step: ordinals 0, 1, 2
    emails_per_task = 1 + len(cc)
    task_ids: list[UUID] = []
    kills_mid_job = kills_in_perform = 0
    try:
        host = runner.start(env)
        for i in range(STANDARD_RUNS):
            tid = tasks.submit(conn, "demo", {"topic": f"std-{i}", "amount": 200 + i, "search_s": 0.02,
                                              "step_sleep_s": 0.03, "cc": cc})
            task_ids.append(tid)
            # A third of the kills anywhere in the job, the rest just after the email or the payment step began.
            aim = ("anywhere", "send_email", "pay")[i % 3]
            if aim == "anywhere":
                time.sleep(rng.uniform(0.0, 0.4))
            else:
                _wait_row(conn, "SELECT 1 FROM step_events WHERE task_id = %s AND step = %s AND event = 'start'",
                          (tid, aim), host, f"run {i} start {aim}")
                time.sleep(rng.uniform(0.0, 0.02 if aim == "send_email" else 0.006))
            host.kill(signal.SIGKILL)
            host.wait(timeout=10)
            state = conn.execute("SELECT t.status, count(e.id) FILTER (WHERE e.state = 'intent') FROM tasks t"
                                 " LEFT JOIN effects e ON e.task_id = t.id WHERE t.id = %s GROUP BY t.status",
                                 (tid,)).fetchone()
            assert state is not None
            kills_mid_job += state[0] != "done"
            kills_in_perform += state[1] > 0
            host = runner.start(env)
            _wait_settled(conn, tid, host, f"run {i}")
        # --- forced: killed inside an email (blocked for a human) and inside a payment (lookup) -------
        params = {"topic": "forced", "amount": 99, "search_s": 0.0, "cc": cc}
        tid = _kill_inside_perform(conn, host, smtp_peer, "email", params)
        task_ids.append(tid)
        host = runner.start(env)
        assert _wait_settled(conn, tid, host, "the forced email round") == "blocked"
        posts = sinks.payment_stats()["posts"]
        tid = _kill_inside_perform(conn, host, payments_peer, "payment", params,
                                   request_to_port=_port(sinks.payments_url),
                                   before_restart=_wait_for_posts(sinks, posts + 1))
        task_ids.append(tid)
        host = runner.start(env)
        assert _wait_settled(conn, tid, host, "the forced payment round") == "done"
        forced = conn.execute("SELECT resolution FROM effects WHERE task_id = %s AND effect = 'payment'",
                              (tid,)).fetchone()
        assert forced is not None and forced[0] == "provider_lookup:found", forced  # charged once, found, not redone
        kills_mid_job += 2
        kills_in_perform += 2

        # --- per task: done with everything once, or blocked in doubt with at most one delivery --------
        delivered = Counter(e["message_id"] for e in sinks.emails())
        stats = sinks.payment_stats()
        charged: dict[str, int] = stats["charges_by_key"]
        done = blocked = blocked_delivered = 0
        expected_mids: set[str] = set()
        expected_charges: set[str] = set()
        for tid in task_ids:
            status, reason, detail = conn.execute(
                "SELECT status, blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
            mids = [message_id_for(idempotency_key(tid, "send_email", "email", n)) for n in range(emails_per_task)]
            pay_key = idempotency_key(tid, "pay", "payment")
            expected_mids.update(mids)
            expected_charges.add(pay_key)
            email_states = dict(conn.execute(
                "SELECT ordinal, state FROM effects WHERE task_id = %s AND effect = 'email'", (tid,)).fetchall())
            if status == "done":
                done += 1
                assert [delivered[m] for m in mids] == [1] * emails_per_task, (tid, mids, delivered)
                assert charged.get(pay_key) == 1, (tid, charged.get(pay_key))
                continue
            assert (status, reason) == ("blocked", "effect_in_doubt"), (tid, status, reason, detail)
            blocked += 1
            in_doubt = [n for n, s in email_states.items() if s == "blocked"]
            assert len(in_doubt) == 1, (tid, email_states)  # only an email can be in doubt with no lookup
            n = in_doubt[0]
            assert delivered[mids[n]] <= 1
            blocked_delivered += delivered[mids[n]]
            assert [delivered[m] for m in mids[:n]] == [1] * n  # the ones before it: committed, sent once
            assert all(delivered[m] == 0 for m in mids[n + 1:]) and pay_key not in charged  # never reached
        # --- never two of anything, nothing that no task asked for -----------------------------------
        assert max(delivered.values()) == 1 and set(delivered) <= expected_mids, delivered
        assert max(charged.values()) == 1 and set(charged) <= expected_charges, charged
        assert sum(delivered.values()) == len(sinks.emails()) and stats["charges"] == sum(charged.values())
        assert _steps_run_twice(conn) == []
        resolved = conn.execute(
            "SELECT resolution, count(*) FROM effects WHERE resolution LIKE 'provider_lookup:%%' GROUP BY 1"
        ).fetchall()
        by_lookup = sum(n for _res, n in resolved)
        print(f"\ncrash suite (standard relay, payments without de-duplication): runs={len(task_ids)}"
              f" sigkills={len(task_ids)} kills_mid_job={kills_mid_job} kills_inside_perform={kills_in_perform}"
              f" done={done} blocked_in_doubt={blocked} (of which delivered before the crash: {blocked_delivered})"
              f" emails={sum(delivered.values())} charges={stats['charges']} provider_posts={stats['posts']}"
              f" in_doubt_resolved_by_lookup={by_lookup} {dict(resolved)} host_starts={runner.n}")
        # The in-doubt paths were taken, not just possible: one blocked email, one charge found by lookup.
        assert blocked >= 1 and by_lookup >= 1
        assert done + blocked == len(task_ids) and kills_mid_job >= STANDARD_RUNS // 2
    finally:
        conn.close()
        runner.stop_all()
        sinks.stop()
