"""Read side of the instance API: threads, tasks with their steps and effects, events, as JSON-ready dicts.

Reads only; every write goes through the stores (tasks, memory, ledger) from `agent_runtime.host.api`. The
shapes are the ones docs/instance-api.md documents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from agent_runtime.state.checkpoints import CheckpointStore
from agent_runtime.state.traces import task_spans

__all__ = ["EFFECT_STATES", "effect_list", "events_after", "message_page", "question", "reply_to", "task_detail",
           "task_list", "task_summary", "thread_exists"]

# Ledger state -> what an operator is told. An intent without an outcome is in doubt until settled.
EFFECT_STATES = {"intent": "in_doubt", "blocked": "blocked", "committed": "committed", "failed": "failed"}
_STATE_FILTERS = {"open": ("intent", "blocked"), "in_doubt": ("intent",), "blocked": ("blocked",),
                  "committed": ("committed",), "failed": ("failed",),
                  "all": ("intent", "blocked", "committed", "failed")}
_MSG = "seq, thread, role, content, metadata, created_at"
_TASK = "id, kind, status, blocked_reason, blocked_detail, created_at, updated_at, params"
_EFFECT = "idem_key, task_id, step, effect, state, resolution, result, created_at, settled_at"


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def _message(row: tuple[Any, ...]) -> dict[str, Any]:
    meta = row[4] or {}
    return {"seq": row[0], "thread": row[1], "role": row[2], "content": row[3],
            "message_id": meta.get("message_id") or meta.get("reply_to"), "task": meta.get("task"),
            "created_at": _iso(row[5])}


def thread_exists(conn: psycopg.Connection, thread: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM messages WHERE thread = %s)", (thread,)).fetchone() == (True,)


def message_page(conn: psycopg.Connection, thread: str, *, after: int | None, before: int | None,
                 limit: int) -> dict[str, Any]:
    """One page of a thread, oldest first, with cursors for newer (`next`) and older (`prev`) messages.

    With both cursors the page is the window between them (``after < seq < before``) read from ``after`` on,
    and ``next`` stays inside the window: a client that holds both ends of a gap fills it without overrun."""
    if after is not None:
        rows = conn.execute(f"SELECT {_MSG} FROM messages WHERE thread = %s AND seq > %s"  # noqa: S608
                            + (" AND seq < %s" if before is not None else "")
                            + " ORDER BY seq LIMIT %s",
                            (thread, after, before, limit + 1) if before is not None else (thread, after, limit + 1)
                            ).fetchall()
        more_new, rows = len(rows) > limit, rows[:limit]
        more_old = after > 0 and conn.execute(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE thread = %s AND seq <= %s)", (thread, after)
        ).fetchone() == (True,)
    else:
        rows = conn.execute(f"SELECT {_MSG} FROM messages WHERE thread = %s"  # noqa: S608
                            + (" AND seq < %s" if before is not None else "")
                            + " ORDER BY seq DESC LIMIT %s",
                            (thread, before, limit + 1) if before is not None else (thread, limit + 1)).fetchall()
        more_old, rows = len(rows) > limit, list(reversed(rows[:limit]))
        more_new = before is not None and conn.execute(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE thread = %s AND seq >= %s)", (thread, before)
        ).fetchone() == (True,)
    messages = [_message(r) for r in rows]
    return {"thread": thread, "messages": messages,
            "next": messages[-1]["seq"] if messages and more_new else None,
            "prev": messages[0]["seq"] if messages and more_old else None}


def _turn(conn: psycopg.Connection, task_id: str, turn: str) -> dict[str, Any] | None:
    row = conn.execute(f"SELECT {_MSG} FROM messages WHERE metadata ? 'task' AND metadata->>'task' = %s"  # noqa: S608
                       " AND metadata->>'turn' = %s ORDER BY seq LIMIT 1", (task_id, turn)).fetchone()
    return _message(row) if row else None


def question(conn: psycopg.Connection, message_id: str) -> dict[str, Any] | None:
    """The user message posted with `message_id` (its task has the same id)."""
    return _turn(conn, message_id, "question")


def reply_to(conn: psycopg.Connection, message_id: str) -> dict[str, Any] | None:
    return _turn(conn, message_id, "answer")


def task_summary(row: tuple[Any, ...], *, with_params: bool = False) -> dict[str, Any]:
    out = {"id": str(row[0]), "kind": row[1], "status": row[2], "blocked_reason": row[3], "blocked_detail": row[4],
           "created_at": _iso(row[5]), "updated_at": _iso(row[6])}
    if with_params:
        out["params"] = row[7]
    return out


def task_row(conn: psycopg.Connection, task_id: UUID) -> tuple[Any, ...] | None:
    return conn.execute(f"SELECT {_TASK} FROM tasks WHERE id = %s", (task_id,)).fetchone()  # noqa: S608


def task_list(conn: psycopg.Connection, *, status: str | None, before: UUID | None, limit: int) -> dict[str, Any]:
    """Newest first; `before` is the id of the last task of the previous page (keyset on created_at, id)."""
    where: list[str] = []
    args: list[Any] = []
    if status:
        where.append("status = %s")
        args.append(status)
    if before is not None:
        where.append("(created_at, id) < (SELECT created_at, id FROM tasks WHERE id = %s)")
        args.append(before)
    rows = conn.execute(f"SELECT {_TASK} FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")  # noqa: S608
                        + " ORDER BY created_at DESC, id DESC LIMIT %s", (*args, limit + 1)).fetchall()
    tasks = [task_summary(r) for r in rows[:limit]]
    return {"tasks": tasks, "next": tasks[-1]["id"] if len(rows) > limit else None}


def _effect(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"key": row[0], "task": str(row[1]), "step": row[2], "effect": row[3],
            "state": EFFECT_STATES.get(row[4], row[4]), "resolution": row[5], "result": row[6],
            "created_at": _iso(row[7]), "settled_at": _iso(row[8])}


def effect_list(conn: psycopg.Connection, *, state: str = "open", task_id: UUID | None = None,
                limit: int = 100) -> list[dict[str, Any]]:
    states = _STATE_FILTERS.get(state)
    if states is None:
        raise ValueError(f"state must be one of: {', '.join(_STATE_FILTERS)}")
    if task_id is not None:
        rows = conn.execute(f"SELECT {_EFFECT} FROM effects WHERE task_id = %s AND state = ANY(%s)"  # noqa: S608
                            " ORDER BY id LIMIT %s", (task_id, list(states), limit)).fetchall()
    else:
        rows = conn.execute(f"SELECT {_EFFECT} FROM effects WHERE state = ANY(%s)"  # noqa: S608
                            " ORDER BY id DESC LIMIT %s", (list(states), limit)).fetchall()
    return [_effect(r) for r in rows]


def effect_get(conn: psycopg.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute(f"SELECT {_EFFECT} FROM effects WHERE idem_key = %s", (key,)).fetchone()  # noqa: S608
    return _effect(row) if row else None


_STEP_STATUS = {"start": "running", "done": "done", "failed": "failed", "waiting": "waiting",
                "abandoned": "pending", "hung": "pending"}


def task_detail(conn: psycopg.Connection, task_id: UUID, step_names: list[str]) -> dict[str, Any] | None:
    """Status, steps with the timings of their latest attempt, every step event in order (a step's attempts
    and what ended each: a 'start' with no 'done' before the next 'start' was interrupted), case file, effects,
    judgments, result and the spans of its runs (`state.traces`: the trace view)."""
    row = task_row(conn, task_id)
    if row is None:
        return None
    events = conn.execute("SELECT step, event, at, error FROM step_events WHERE task_id = %s ORDER BY id",
                          (task_id,)).fetchall()
    steps: dict[str, dict[str, Any]] = {n: {"name": n, "status": "pending", "attempts": 0, "started_at": None,
                                            "finished_at": None, "duration_ms": None} for n in step_names}
    for step, event, at, error in events:
        if event == "retried":  # an operator's retry: every step's attempts count again from here
            for s in steps.values():
                s["attempts"] = 0
            continue
        s = steps.setdefault(step, {"name": step, "status": "pending", "attempts": 0, "started_at": None,
                                    "finished_at": None, "duration_ms": None})
        s["status"] = _STEP_STATUS.get(event, event)
        if error:
            s["error"] = error
        if event == "start":
            s.update(attempts=s["attempts"] + 1, started_at=at, finished_at=None, duration_ms=None)
            s.pop("error", None)
        elif s["started_at"] is not None:
            s.update(finished_at=at, duration_ms=round((at - s["started_at"]).total_seconds() * 1000, 1))
    if row[2] != "running":
        for s in steps.values():
            if s["status"] == "running":
                s["status"] = "interrupted"
    for s in steps.values():
        s["started_at"], s["finished_at"] = _iso(s["started_at"]), _iso(s["finished_at"])
    store = CheckpointStore(conn)
    case = store.case_file(store.latest(task_id))
    done_order = [n for n in step_names if n in case.steps_done] or list(case.steps_done)
    judgments = conn.execute("SELECT name, passed, artifact_digest, created_at FROM judgments WHERE task_id = %s"
                             " ORDER BY id", (task_id,)).fetchall()
    return {"task": task_summary(row, with_params=True), "steps": list(steps.values()),
            "events": [{"step": step, "event": event, "at": _iso(at), **({"error": error} if error else {})}
                       for step, event, at, error in events],
            "case_file": {"done": case.steps_done, "waiting_on": case.waiting_on, "ruled_out": case.ruled_out,
                          "notes": case.notes},
            "effects": effect_list(conn, state="all", task_id=task_id, limit=1000),
            "judgments": [{"name": j[0], "passed": j[1], "artifact_digest": j[2], "created_at": _iso(j[3])}
                          for j in judgments],
            "result": case.steps_done.get(done_order[-1]) if row[2] == "done" and done_order else None,
            "spans": task_spans(conn, task_id)}


def events_after(conn: psycopg.Connection, step_after: int, host_after: int, limit: int = 500
                 ) -> list[tuple[str, dict[str, Any]]]:
    """Step and host events past the cursors, oldest first, as (SSE id, event) pairs; id 's<n>-h<m>'."""
    steps = conn.execute("SELECT id, task_id, step, event, at FROM step_events WHERE id > %s ORDER BY id LIMIT %s",
                         (step_after, limit)).fetchall()
    hosts = conn.execute("SELECT id, kind, at FROM host_events WHERE id > %s ORDER BY id LIMIT %s",
                         (host_after, limit)).fetchall()
    merged: list[tuple[Any, int, int, dict[str, Any]]] = (
        [(r[4], r[0], 0, {"type": "step", "task": str(r[1]), "step": r[2], "event": r[3], "at": _iso(r[4])})
         for r in steps]
        + [(r[2], 0, r[0], {"type": "host", "kind": r[1], "at": _iso(r[2])}) for r in hosts])
    merged.sort(key=lambda e: (e[0], e[1], e[2]))
    out = []
    s_cur, h_cur = step_after, host_after
    for _at, sid, hid, ev in merged:
        s_cur, h_cur = max(s_cur, sid), max(h_cur, hid)
        out.append((f"s{s_cur}-h{h_cur}", ev))
    return out
