"""Faults an agent-host must absorb without a supervisor's help: conversation threads interleaved in the one
global message sequence (memory rollover must cover every message), a step returning NaN (one failed step,
not a crashed instance), a stalled database under an idle host (/healthz must say so)."""

from __future__ import annotations

import json
import time
from collections import Counter

import psycopg
from psycopg import sql

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.migrations import migrate

from .core import Kit, Outcome, attack, settled

# --- interleaved conversation threads ------------------------------------------------------------------------
TOKEN_BUDGET = 200
TASKS_PER_RUN = 8
BUSY_PER_TASK = 520  # a quiet thread's consecutive messages lie more than this apart in the global sequence


@attack("interleaved-threads",
        f"{TASKS_PER_RUN} tasks, each {BUSY_PER_TASK} messages on a busy thread and one long message on each of two "
        "quiet threads; the host folds threads past the token budget",
        "messages neither handed to the summarizer nor in the window (lost), or folded twice (dup)")
def interleaved_threads(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("interleaved-threads")
    fold_log = scratch / "folds.jsonl"
    with kit.tenant() as t, kit.hosts("interleaved-threads-hosts") as hosts, \
            connect(t.dsn, t.schema, autocommit=True) as conn:
        migrate(conn, t.schema)
        env = kit.host_env(t, scratch, AGENT_MEMORY_TOKEN_BUDGET=str(TOKEN_BUDGET),
                           CRASHKIT_FOLD_LOG=str(fold_log))
        hosts.start(env)
        hosts.wait_ready(env)
        for i in range(runs):
            busy, quiet = f"r{i}-busy", [f"r{i}-quiet-1", f"r{i}-quiet-2"]
            ids = [tasks.submit(conn, "ck_threads", {"busy": BUSY_PER_TASK, "busy_thread": busy, "quiet": quiet})
                   for _ in range(TASKS_PER_RUN)]
            ids.append(tasks.submit(conn, "ck_threads", {}))  # done => the last real task's fold has run
            for tid in ids:
                status, reason = settled(conn, tid, 120)
                if status != "done":
                    raise RuntimeError(f"task {tid} ended {status} ({reason})")
            folded: Counter[int] = Counter()
            for line in fold_log.read_text().splitlines():
                folded.update(json.loads(line)["seqs"])
            lost = dup = 0
            for thread in [busy, *quiet]:
                store = MemoryStore(conn, thread)
                summary = store.latest_summary()
                upto = summary.upto_seq if summary else 0
                window = {m.seq for m in store.window(TOKEN_BUDGET).messages}
                seqs = [int(r[0]) for r in conn.execute("SELECT seq FROM messages WHERE thread = %s ORDER BY seq",
                                                        (thread,)).fetchall()]
                lost += sum(1 for s in seqs if (folded[s] == 0 if s <= upto else s not in window))
                dup += sum(folded[s] - 1 for s in seqs if folded[s] > 1)
            out.ours.lost += lost
            out.ours.dup += dup
            out.runs += 1
            kit.say(f"run {i + 1}/{runs}: {TASKS_PER_RUN} tasks on 3 interleaved threads: {lost} message(s) lost, "
                    f"{dup} folded twice")


# --- a step returning NaN --------------------------------------------------------------------------------------
@attack("nan-step", "a step returns NaN (its result cannot be stored as JSON); the kit restarts a host that exits",
        "instance restarts (unsafe); the task not ending failed/blocked with a failed step = lost")
def nan_step(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("nan-step")
    with kit.tenant() as t, kit.hosts("nan-step-hosts") as hosts, connect(t.dsn, t.schema, autocommit=True) as conn:
        migrate(conn, t.schema)
        env = kit.host_env(t, scratch)
        host = hosts.start(env)
        hosts.wait_ready(env)
        for i in range(runs):
            tid = tasks.submit(conn, "ck_nan", {})
            restarts, exits = 0, []
            deadline = time.monotonic() + 45
            status = reason = None
            while time.monotonic() < deadline:
                if not host.alive():  # a supervisor restarts an instance that exits
                    exits.append(host.p.returncode)
                    restarts += 1
                    host = hosts.start(env)
                    hosts.wait_ready(env)
                row = conn.execute("SELECT status, blocked_reason FROM tasks WHERE id = %s", (tid,)).fetchone()
                if row and row[0] in ("done", "blocked", "failed"):
                    status, reason = row
                    time.sleep(0.5)  # still up a moment later?
                    if host.alive():
                        break
                time.sleep(0.05)
            failed = conn.execute("SELECT count(*) FROM step_events WHERE task_id = %s AND step = 'score' AND"
                                  " event = 'failed'", (tid,)).fetchone()
            n_failed = int(failed[0]) if failed else 0
            out.ours.unsafe += restarts
            out.ours.lost += status not in ("blocked", "failed") or n_failed == 0
            out.runs += 1
            kit.say(f"run {i + 1}/{runs}: task {status}{f' ({reason})' if reason else ''}, {n_failed} failed "
                    f"step event(s), {restarts} instance restart(s){f' (exit codes {exits})' if exits else ''}")


# --- a stalled database under an idle host ---------------------------------------------------------------------
DETECT_S = 20.0


@attack("stalled-db-healthz",
        "an idle host; another session holds LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE (the database stalls)",
        f"stalls /healthz did not report with 503 within {DETECT_S:.0f} s (lost)")
def stalled_db_healthz(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("stalled-db")
    with kit.tenant() as t, kit.hosts("stalled-db-hosts") as hosts, connect(t.dsn, t.schema, autocommit=True) as conn:
        migrate(conn, t.schema)
        env = kit.host_env(t, scratch, AGENT_HEARTBEAT_INTERVAL_S="0.5")
        host = hosts.start(env)
        hosts.wait_ready(env)

        def healthz() -> int:
            try:
                return hosts.get(env, "/healthz")[0]
            except OSError:
                return 0  # no answer at all

        for i in range(runs):
            t0 = time.monotonic()
            while healthz() != 200 and time.monotonic() - t0 < 15:
                time.sleep(0.2)
            with psycopg.connect(t.admin_dsn) as lock:
                lock.execute("SET lock_timeout = '10s'")
                lock.execute(sql.SQL("LOCK TABLE {}.tasks IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(t.schema)))
                t0 = time.monotonic()
                detected_after: float | None = None
                while time.monotonic() - t0 < DETECT_S:
                    code = healthz()
                    if code == 503:
                        detected_after = time.monotonic() - t0
                        break
                    time.sleep(0.2)
                lock.rollback()
            t1 = time.monotonic()
            while healthz() != 200 and time.monotonic() - t1 < 15:
                time.sleep(0.2)
            recovered = healthz() == 200
            out.ours.lost += detected_after is None
            if not host.alive():
                out.ours.unsafe += 1
                out.note(f"run {i + 1}: the host exited ({host.p.returncode}) instead of reporting")
                host = hosts.start(env)
                hosts.wait_ready(env)
            out.runs += 1
            kit.say(f"run {i + 1}/{runs}: database stalled: /healthz "
                    f"{f'503 after {detected_after:.1f} s' if detected_after is not None else 'never 503'}; "
                    f"lock released: {'200 again' if recovered else 'not healthy again within 15 s'}")
