"""A step's cost does not grow with the tenant's history (issue 39): no statement a step with an effect sends scans
the tenant's `effects`, `tasks`, `step_events`, `checkpoints` or `case_entries` tables whole. The ledger position a
checkpoint records (the task's newest committed effect) was read by a scan of every effect the tenant ever made: at
200,000 effects a one-effect step took 22 ms where it takes 4 (`bench/bench_sdk.py`). Migration 21 indexes effects
by task.

Counted by PostgreSQL itself (`pg_stat_user_tables.seq_scan`) around a real run, on tables filled with other tasks'
rows (all but `case_entries`, which stays small) and analysed, so that the planner would choose a scan if it had no
index to use."""

from __future__ import annotations

from typing import Any

import psycopg

from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks

agent = Agent("history-cost")


@agent.step
def pay(ctx: Context) -> Any:
    return ctx.effect("payment", {"amount": 700, "currency": "eur", "customer": "cus_1"})


@agent.step
def record(ctx: Context) -> Any:
    return {"noted": True}


TABLES = ("effects", "tasks", "step_events", "checkpoints", "case_entries")


def _seq_scans(conn: psycopg.Connection) -> dict[str, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counters, flushed before they are read
    rows = conn.execute("SELECT relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = current_schema()"
                        " AND relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {name: int(n) for name, n in rows}


def test_a_step_scans_no_table_of_the_tenants_history(runtime: Runtime) -> None:
    rt = runtime
    # Another 20,000 tasks' worth of history: a scan of any of these tables now costs more than an index probe.
    rt.conn.execute(
        "WITH t AS (INSERT INTO tasks (id, kind, params, status) SELECT gen_random_uuid(), 'old', '{}', 'done'"
        " FROM generate_series(1, 20000) RETURNING id),"
        " e AS (INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, checksum, revision)"
        " SELECT id, 's', 'payment', 'old:' || id, '{}', 'd', 'committed', 'x', 1 FROM t),"
        " s AS (INSERT INTO step_events (task_id, step, event) SELECT id, 's', 'done' FROM t)"
        " INSERT INTO checkpoints (task_id, seq, branch, step, kind, format_version, workspace_digest, ledger_pos,"
        " checksum) SELECT id, 1, 0, 's', 'step', 1, 'd', 0, 'x' FROM t")
    for table in TABLES:
        rt.conn.execute(f"ANALYZE {table}")
    task_id = tasks.submit(rt.conn, agent.kind, {})
    before = _seq_scans(rt.conn)
    assert run_task(rt, agent, task_id) == "done"
    after = _seq_scans(rt.conn)
    assert set(before) == set(TABLES)
    scanned = {t: after[t] - before[t] for t in TABLES if after[t] != before[t]}
    # _seq_scans' own statements read the statistics views, not these tables.
    assert scanned == {}, f"a step scanned the tenant's history: {scanned}"
    effects = rt.ledger.for_task(task_id)
    assert len(effects) == 1 and effects[0].state == "committed"
    assert rt.ledger.position(task_id) == effects[0].id
