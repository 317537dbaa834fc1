"""Crash at any point: 50 demo jobs, each with a SIGKILL of agent-host at a random moment and a restart.

Every job must finish; no completed step may run again; every effect must happen exactly once at the
sinks; a search whose result was cached must never be paid for again.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from agent_runtime.state.toolcache import ToolCache

from .conftest import HostRunner, TenantDB, make_env, start_sinks

RUNS = 50


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
    task_ids = []
    kills_while_unfinished = 0
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
            deadline = time.monotonic() + 30
            while True:
                row = conn.execute("SELECT status FROM tasks WHERE id = %s", (tid,)).fetchone()
                if row and row[0] in ("done", "blocked", "failed"):
                    break
                assert time.monotonic() < deadline, f"run {i} never finished:\n{host.output()[-3000:]}"
                time.sleep(0.02)
            assert row[0] == "done", (row, conn.execute("SELECT blocked_reason, blocked_detail FROM tasks"
                                                        " WHERE id = %s", (tid,)).fetchone())

        # --- no completed step ran twice -------------------------------------------------------
        repeated = conn.execute(
            "SELECT d.task_id, d.step FROM step_events d JOIN step_events s"
            " ON s.task_id = d.task_id AND s.step = d.step AND s.event = 'start' AND s.id > d.id"
            " WHERE d.event = 'done'").fetchall()
        assert repeated == []
        done_counts = conn.execute(
            "SELECT count(*) FILTER (WHERE event = 'done'), count(DISTINCT (task_id, step)),"
            " count(*) FILTER (WHERE event = 'start') FROM step_events").fetchone()
        assert done_counts[0] == done_counts[1] == RUNS * 7
        # --- effects exactly once --------------------------------------------------------------
        subjects = Counter(e["subject"] for e in sinks.emails())
        assert all(subjects[f"Report {tid}"] == 1 for tid in task_ids), subjects
        assert sum(subjects.values()) == RUNS
        stats = sinks.payment_stats()
        assert stats["charges"] == RUNS and set(stats["charges_by_key"].values()) == {1}
        assert stats["replays"] == 0  # the provider never even saw a second attempt
        resolved = conn.execute("SELECT count(*) FROM effects WHERE resolution LIKE 'provider_lookup%%'").fetchone()
        # --- cached tool calls not paid twice --------------------------------------------------
        calls = [json.loads(line) for line in search_log.read_text().splitlines()]
        rows = conn.execute("SELECT tool, args_hash, extract(epoch FROM created_at) FROM tool_cache").fetchall()
        cached_at = {h: float(ts) for _tool, h, ts in rows}
        paid_after_cached = [c for c in calls if c["t"] > cached_at.get(ToolCache.args_hash({"q": c["q"]}), 1e20)]
        assert paid_after_cached == []
        distinct = len({c["q"] for c in calls})
        assert distinct == RUNS * 2
        print(f"\ncrash suite: runs={RUNS} kills_mid_job={kills_while_unfinished} host_starts={runner.n}"
              f" steps_done={done_counts[0]} step_starts={done_counts[2]} emails={sum(subjects.values())}"
              f" charges={stats['charges']} provider_replays={stats['replays']}"
              f" in_doubt_resolved_by_lookup={resolved[0] if resolved else 0}"
              f" searches_paid={len(calls)} distinct_searches={distinct}"
              f" repaid_interrupted_before_cache={len(calls) - distinct} paid_after_cached=0")
        assert kills_while_unfinished >= RUNS // 2  # the kills really landed mid-job
    finally:
        conn.close()
        runner.stop_all()
        for p in sinks.procs:
            p.stop()
