"""The LangGraph example agent inside real agent-host processes, SIGKILLed in the middle of graph steps.

The payments peer ignores Idempotency-Key (dedupe off), so only the effect ledger, keyed by the graph's
logical step, stands between a kill and a second charge. Every task must finish with one charge per user
request -- never two -- and its graph thread must hold each request and each answer once.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

from agent_examples.langgraph_agent import build_graph
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agent_runtime.db import connect
from agent_runtime.integrations.langgraph import TenantCheckpointer, thread_task_id
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, TenantDB, make_env, start_sinks

KILLS = 20
TURNS = 80  # enough work that 20 kills all land before the task is done


def test_sigkill_mid_graph_step_finishes_with_no_duplicate_charge(tenant_db: TenantDB, tmp_path: Path) -> None:
    sinks = start_sinks(tmp_path / "sinks", dedupe=False)
    runner = HostRunner(tmp_path)
    env = make_env(tenant_db, tmp_path, AGENT_PAYMENTS_URL=sinks.payments_url, AGENT_POLL_INTERVAL_S="0.02")
    conn = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    migrate(conn, tenant_db.schema)
    rng = random.Random(18)
    started = time.monotonic()
    try:
        tid = tasks.submit(conn, "langgraph", {"turns": TURNS, "amount": 500, "node_sleep_s": 0.02})
        kills = 0
        host = runner.start(env)
        while kills < KILLS:
            runner.wait_ready(env)
            time.sleep(rng.uniform(0.05, 0.35))
            status = conn.execute("SELECT status FROM tasks WHERE id = %s", (tid,)).fetchone()
            assert status is not None and status[0] != "done", f"the task finished after only {kills} kills"
            host.kill(signal.SIGKILL)
            host.wait(timeout=10)
            kills += 1
            host = runner.start(env)
        deadline = time.monotonic() + 60
        while (row := conn.execute("SELECT status, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
               ) is not None and row[0] not in ("done", "blocked", "failed"):
            assert time.monotonic() < deadline, host.output()[-3000:]
            time.sleep(0.05)
        assert row is not None and row[0] == "done", (row, host.output()[-3000:])

        stats = sinks.payment_stats()
        amounts = Counter(c["amount"] for c in stats["charge_list"])
        effects = TenantCheckpointer(conn).ledger.for_task(thread_task_id(str(tid)))
        assert amounts == Counter(500 + turn for turn in range(TURNS)), [  # one charge per request, none twice
            (e.step, e.ordinal, e.args, e.state, e.resolution) for e in effects if e.args["amount"] in
            [a for a, n in amounts.items() if n > 1]]
        assert [e.state for e in effects] == ["committed"] * TURNS

        state = build_graph(TenantCheckpointer(conn)).get_state({"configurable": {"thread_id": str(tid)}})
        messages = state.values["messages"]
        assert sum(isinstance(m, HumanMessage) for m in messages) == TURNS
        assert sum(isinstance(m, ToolMessage) for m in messages) == TURNS
        assert sum(isinstance(m, AIMessage) and bool(m.content) for m in messages) == TURNS
        print(f"\nlanggraph crash: kills={kills} host_starts={runner.n} turns={TURNS} charges={stats['charges']}"
              f" provider_posts={stats['posts']} elapsed_s={time.monotonic() - started:.1f}")
    finally:
        conn.close()
        runner.stop_all()
        sinks.stop()
