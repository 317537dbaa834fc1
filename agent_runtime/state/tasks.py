"""Durable task submission and the task table's small state machine (pending/running/blocked/done/failed)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["Task", "submit", "get", "unfinished", "set_status", "NOTIFY_CHANNEL"]

NOTIFY_CHANNEL = "agent_tasks"


@dataclass(frozen=True)
class Task:
    id: UUID
    kind: str
    params: dict[str, Any]
    status: str
    branch: int
    blocked_reason: str | None
    blocked_detail: str | None
    progress_seq: int


_COLS = "id, kind, params, status, branch, blocked_reason, blocked_detail, progress_seq"


def submit(conn: psycopg.Connection, kind: str, params: dict[str, Any] | None = None,
           task_id: UUID | None = None) -> UUID:
    """Durably enqueue a task in the tenant schema (commits when `conn` is autocommit)."""
    tid = task_id or uuid.uuid4()
    with conn.transaction():
        conn.execute("INSERT INTO tasks (id, kind, params) VALUES (%s, %s, %s)", (tid, kind, Jsonb(params or {})))
        conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(tid)))
    return tid


def get(conn: psycopg.Connection, task_id: UUID) -> Task | None:
    row = conn.execute(f"SELECT {_COLS} FROM tasks WHERE id = %s", (task_id,)).fetchone()  # noqa: S608
    return Task(*row) if row else None


def unfinished(conn: psycopg.Connection) -> list[Task]:
    """Tasks to run, interrupted ones ('running') first, then pending in submission order."""
    rows = conn.execute(
        f"SELECT {_COLS} FROM tasks WHERE status IN ('pending', 'running')"  # noqa: S608
        " ORDER BY (status = 'running') DESC, created_at, id"
    ).fetchall()
    return [Task(*r) for r in rows]


def set_status(conn: psycopg.Connection, task_id: UUID, status: str, reason: str | None = None,
               detail: str | None = None) -> None:
    conn.execute(
        "UPDATE tasks SET status = %s, blocked_reason = %s, blocked_detail = %s, updated_at = clock_timestamp()"
        " WHERE id = %s",
        (status, reason, detail, task_id),
    )
