"""The spans of each task's runs, in the tenant's schema (`trace_spans`): what the trace view draws.

Rows come from `host.tracing.TaskSpanBuffer`, written by the runner at step boundaries on the worker's
connection; their attributes are redacted before they get here. Bounded two ways: at most `max_per_task` spans
per task (the run and step spans are kept first, then the newest of the rest), and rows older than
`keep_days` are deleted (`spans_prune`, after task runs). The control plane reads them through the instance
API's task detail (`host.api_queries.task_detail`), never from this table directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

__all__ = ["spans_prune", "spans_write", "task_spans"]

# Trim a task to its cap, keeping what the waterfall cannot do without first (its runs and steps), then the newest.
_TRIM = ("DELETE FROM trace_spans WHERE task_id = %s AND id NOT IN (SELECT id FROM trace_spans WHERE task_id = %s"
         " ORDER BY (name LIKE 'invoke_agent %%' OR name LIKE 'step %%') DESC, id DESC LIMIT %s)")


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False).replace("\\u0000", "")


def spans_write(conn: psycopg.Connection, rows: Sequence[dict[str, Any]], *, max_per_task: int) -> int:
    """Store `rows` (a span seen twice is stored once) and trim each of their tasks to `max_per_task` spans;
    return how many were new."""
    if not rows:
        return 0
    new = 0
    with conn.cursor() as cur:
        for r in rows:
            cur.execute(
                "INSERT INTO trace_spans (task_id, trace_id, span_id, parent_span_id, name, kind, status, started_at,"
                " duration_ms, attributes) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
                " ON CONFLICT (trace_id, span_id) DO NOTHING",
                (r["task_id"], r["trace_id"], r["span_id"], r["parent_span_id"], r["name"][:500], r["kind"],
                 r["status"], r["started_at"], r["duration_ms"], _json(r["attributes"])))
            new += cur.rowcount
        for task_id in {r["task_id"] for r in rows}:
            cur.execute(_TRIM, (task_id, task_id, max_per_task))
    return new


def spans_prune(conn: psycopg.Connection, *, older_than: datetime) -> int:
    """Delete spans that started before `older_than`; return how many."""
    cur = conn.execute("DELETE FROM trace_spans WHERE started_at < %s", (older_than,))
    return cur.rowcount


def task_spans(conn: psycopg.Connection, task_id: UUID, *, limit: int = 1000) -> list[dict[str, Any]]:
    """The task's spans, oldest first, as the instance API gives them (times in ISO 8601)."""
    rows = conn.execute(
        "SELECT trace_id, span_id, parent_span_id, name, kind, status, started_at, duration_ms, attributes"
        " FROM trace_spans WHERE task_id = %s ORDER BY started_at, id LIMIT %s", (task_id, limit)).fetchall()
    return [{"trace_id": t, "span_id": s, "parent_span_id": p, "name": n, "kind": k, "status": st,
             "started_at": at.isoformat(), "duration_ms": round(float(d), 3), "attributes": a}
            for t, s, p, n, k, st, at, d, a in rows]
