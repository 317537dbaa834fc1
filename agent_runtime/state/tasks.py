"""Durable task submission and the task table's small state machine.

pending -> running -> done | failed | blocked; blocked -> pending (a human decided, an operator retried, or the
credential it waited for is there); pending, running or blocked -> cancelled (a cancel never interrupts a step: the
worker checks between steps); a message's run, pending or running -> interrupted | rolled_back (a new message's
thread policy, `state.threads`; also at the next step boundary).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.state.checkpoints import COLUMNS as CHECKPOINT_COLUMNS

__all__ = ["ASYNC_COMMIT", "ENDED", "ENDED_BY_REQUEST", "RETRYABLE", "Task", "async_commit", "blocked_credentials",
           "blocked_waiting", "cancel", "config_record", "config_recorded", "get", "notify_channel", "release_cross",
           "release_record", "release_recorded", "resume_credential", "retry", "set_status", "start_run", "submit",
           "submit_once", "unblock_loadable_releases", "unfinished"]

ENDED = ("done", "failed", "cancelled", "interrupted", "rolled_back")
# Ended by a request (a cancel, a thread policy) while the worker may still be inside a step: final, so nothing
# the worker writes when that step returns replaces them.
ENDED_BY_REQUEST = ("cancelled", "interrupted", "rolled_back")
# What an operator may retry: a task that stopped short of its end and waits for someone (a poison step is blocked).
RETRYABLE = ("blocked", "failed")


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
# The one place that names the tasks' channel: a random name kept in the tenant's own schema (migration 19).
_CHANNEL_SQL = "SELECT name FROM task_channel"


def notify_channel(conn: psycopg.Connection) -> str:
    """The channel this schema's task notifications go on, for a host to LISTEN to.

    PostgreSQL has no permissions on LISTEN, and tenants' schemas may share a database: on a name another tenant
    can know or derive (a constant, the schema's name or a hash of it) its role would hear every submit. This one
    is random and readable only by the schema's own role (docs/security.md, row 3m).
    """
    row = conn.execute(_CHANNEL_SQL).fetchone()
    if row is None:  # pragma: no cover - migration 19 inserts the row and nothing deletes it
        raise LookupError("task_channel is empty: the schema was not migrated by this runtime")
    return str(row[0])


def _notify_pending(conn: psycopg.Connection) -> None:
    """Wake this tenant's idle host: an empty payload on its own channel (the host looks for pending tasks itself,
    so not even a task id leaves the transaction). The name is read in the same statement, on the caller's
    connection and search_path, so whoever submits (the host's API, the CLI, the dev loop) notifies the right
    channel with no cache to go stale."""
    conn.execute(f"SELECT pg_notify(({_CHANNEL_SQL}), '')")  # noqa: S608


def submit(conn: psycopg.Connection, kind: str, params: dict[str, Any] | None = None,
           task_id: UUID | None = None) -> UUID:
    """Durably enqueue a task in the tenant schema (commits when `conn` is autocommit)."""
    tid = task_id or uuid.uuid4()
    # One statement, so one round trip and one (synchronous) commit: the notification is sent by the row's own
    # transaction, as `_notify_pending` would, without the BEGIN and COMMIT an explicit transaction costs.
    conn.execute(f"WITH ins AS (INSERT INTO tasks (id, kind, params) VALUES (%s, %s, %s) RETURNING id)"  # noqa: S608
                 f" SELECT pg_notify(({_CHANNEL_SQL}), '') FROM ins", (tid, kind, Jsonb(params or {})))
    return tid


def submit_once(conn: psycopg.Connection, task_id: UUID, kind: str, params: dict[str, Any]) -> tuple[Task, bool]:
    """Enqueue `task_id` unless it exists: the caller's id is the idempotency key. Returns (task, created).

    The caller compares kind and params of an existing task: the same id with other arguments is its error.
    Runs inside the caller's transaction when there is one (a message and its task commit together).
    """
    row = conn.execute(
        f"INSERT INTO tasks (id, kind, params) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING"  # noqa: S608
        f" RETURNING {_COLS}", (task_id, kind, Jsonb(params))).fetchone()
    if row is not None:
        _notify_pending(conn)
        return Task(*row), True
    existing = get(conn, task_id)
    assert existing is not None
    return existing, False


def cancel(conn: psycopg.Connection, task_id: UUID) -> Task | None:
    """Cancel a task that has not ended; None when it has (or does not exist). The worker stops before its next
    step; a step already running finishes and its effects stay committed facts."""
    row = conn.execute(
        f"UPDATE tasks SET status = 'cancelled', updated_at = clock_timestamp() WHERE id = %s"  # noqa: S608
        f" AND status IN ('pending', 'running', 'blocked') RETURNING {_COLS}", (task_id,)).fetchone()
    return Task(*row) if row else None


def retry(conn: psycopg.Connection, task_id: UUID, release: dict[str, str] | None = None) -> Task | None:
    """Queue a blocked or failed task again; None when it is in any other state (or does not exist).

    It resumes from its latest checkpoint like an interrupted task: steps in the case file are not run again and
    committed effects return their recorded result. A 'retried' event resets the attempt count of every step (the
    attempts before it were the broken release's or the missing cause's, not the fixed one's).

    ``release``: the release the retrying instance runs. A retry is how an operator says "run it on the fixed
    release": a task that started on another one continues on this one, recorded as a crossing.
    """
    with conn.transaction():
        row = conn.execute(
            f"UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"  # noqa: S608
            f" blocked_credential = NULL, updated_at = clock_timestamp() WHERE id = %s"
            f" AND status IN ('blocked', 'failed') RETURNING {_COLS}", (task_id,)).fetchone()
        if row is None:
            return None
        conn.execute("INSERT INTO step_events (task_id, step, event) VALUES (%s, '', 'retried')", (task_id,))
        if release is not None:
            release_cross(conn, task_id, release, "retried by an operator")
        _notify_pending(conn)
    return Task(*row)


def _release_label(release: dict[str, str]) -> str:
    return f"{release.get('version') or '(no version)'} ({release.get('digest') or 'runtime agents'})" \
        if release.get("digest") else "the runtime's agents"


def release_record(conn: psycopg.Connection, task_id: UUID, current: dict[str, str]) -> dict[str, str]:
    """The release `task_id` started on: the one recorded on its row, else `current`, recorded first.

    Recorded before the first step and never moved except by a crossing (`release_cross`), so a task interrupted
    by a rollout knows where it must finish. A row from before version 15 that already ran gets the release of
    the first host to see it (what it ran on before is not known).
    """
    conn.execute("UPDATE tasks SET release = %s WHERE id = %s AND release IS NULL", (Jsonb(current), task_id))
    row = conn.execute("SELECT release FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return dict(row[0]) if row is not None and row[0] is not None else dict(current)


def release_recorded(conn: psycopg.Connection, task_id: UUID) -> dict[str, str] | None:
    """The release `task_id` started on; None before it was first placed on one (it never ran a step)."""
    row = conn.execute("SELECT release FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return dict(row[0]) if row is not None and row[0] is not None else None


def release_cross(conn: psycopg.Connection, task_id: UUID, to: dict[str, str], why: str) -> bool:
    """Move `task_id` to release `to`, with a 'release_crossed' event naming both; False if it already runs there.

    The event is what a rollout's health gate counts: a task whose steps ran on two releases."""
    row = conn.execute("SELECT release FROM tasks WHERE id = %s FOR UPDATE", (task_id,)).fetchone()
    if row is None or row[0] is None or dict(row[0]).get("digest", "") == to.get("digest", ""):
        if row is not None and row[0] is None:
            conn.execute("UPDATE tasks SET release = %s WHERE id = %s", (Jsonb(to), task_id))
        return False
    detail = f"{_release_label(dict(row[0]))} -> {_release_label(to)}: {why}"
    conn.execute("UPDATE tasks SET release = %s WHERE id = %s", (Jsonb(to), task_id))
    conn.execute("INSERT INTO step_events (task_id, step, event, error) VALUES (%s, '', 'release_crossed', %s)",
                 (task_id, detail))
    return True


def unblock_loadable_releases(conn: psycopg.Connection, digests: list[str]) -> int:
    """Tasks blocked only because their release could not be loaded run again once it can (the instance booted
    on it again, or keeps it loadable): the block was a fact about the instance, not a human decision."""
    done = conn.execute(
        "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"
        " updated_at = clock_timestamp() WHERE status = 'blocked' AND blocked_reason = 'release_unavailable'"
        " AND coalesce(release->>'digest', '') = ANY(%s)", (digests,))
    return done.rowcount


def blocked_credentials(conn: psycopg.Connection) -> list[str]:
    """Names of the credentials blocked tasks wait for (names only: values are never stored)."""
    rows = conn.execute("SELECT DISTINCT blocked_credential FROM tasks WHERE status = 'blocked'"
                        " AND blocked_reason = 'credential_unavailable' AND blocked_credential IS NOT NULL"
                        " ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def blocked_waiting(conn: psycopg.Connection) -> dict[str, list[str]]:
    """``blocked_credentials`` and ``blocked_connections`` in one query: block reason -> the names its tasks wait
    for. The host asks once per heartbeat interval, idle or not, so one round trip instead of two counts."""
    rows = conn.execute("SELECT DISTINCT blocked_reason, blocked_credential FROM tasks WHERE status = 'blocked'"
                        " AND blocked_reason IN ('credential_unavailable', 'connection_needs_reauth')"
                        " AND blocked_credential IS NOT NULL ORDER BY 1, 2").fetchall()
    out: dict[str, list[str]] = {}
    for reason, name in rows:
        out.setdefault(reason, []).append(name)
    return out


def resume_credential(conn: psycopg.Connection, name: str) -> int:
    """The credential `name` is available again: its blocked tasks run again from their checkpoints. The block was
    a fact about the vault, not a human decision, so no one needs to press Retry."""
    done = conn.execute(
        "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL, blocked_credential = NULL,"
        " updated_at = clock_timestamp() WHERE status = 'blocked' AND blocked_reason = 'credential_unavailable'"
        " AND blocked_credential = %s", (name,))
    return done.rowcount


def blocked_connections(conn: psycopg.Connection) -> list[str]:
    """Providers whose connection blocked tasks wait for (a `connection_needs_reauth` block keeps the provider in
    `blocked_credential`: the column holds the name of what the block waits for)."""
    rows = conn.execute("SELECT DISTINCT blocked_credential FROM tasks WHERE status = 'blocked'"
                        " AND blocked_reason = 'connection_needs_reauth' AND blocked_credential IS NOT NULL"
                        " ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def blocked_connection_tasks(conn: psycopg.Connection) -> list[tuple[UUID, str]]:
    """(task id, provider) of every task blocked `connection_needs_reauth`: whether a connection is usable again
    depends on the task (an end user's task waits for that end user's connection), so each is asked for."""
    rows = conn.execute("SELECT id, blocked_credential FROM tasks WHERE status = 'blocked'"
                        " AND blocked_reason = 'connection_needs_reauth' AND blocked_credential IS NOT NULL"
                        " ORDER BY updated_at, id").fetchall()
    return [(r[0], r[1]) for r in rows]


def resume_connection_task(conn: psycopg.Connection, task_id: UUID, provider: str) -> int:
    """The connection task `task_id` waits for (its end user's, or the tenant's) is usable again: it runs again from
    its checkpoint, no Retry needed (the block was a fact about the connection, which the customer has mended)."""
    done = conn.execute(
        "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL, blocked_credential = NULL,"
        " updated_at = clock_timestamp() WHERE id = %s AND status = 'blocked'"
        " AND blocked_reason = 'connection_needs_reauth' AND blocked_credential = %s", (task_id, provider))
    return done.rowcount


# Put in a statement's select list or RETURNING: its transaction commits without waiting for the WAL flush, and
# the setting ends with that transaction (`is_local`). Only for writes a later synchronous commit on the same
# connection makes durable before anything outside acts on them (docs/runtime.md, "Commits that do not wait").
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true)"


def async_commit(conn: psycopg.Connection) -> str:
    """`ASYNC_COMMIT` when the statement will be its own transaction (an autocommit connection, idle, not in
    pipeline mode), else a no-op: inside a caller's transaction, or a pipeline's implicit one, the setting would
    outlive the statement and make a later commit, maybe an effect's intent, asynchronous too."""
    own = (conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
           and conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF)
    return ASYNC_COMMIT if own else "NULL"


def start_run(conn: psycopg.Connection, task_id: UUID, *, with_checkpoint: bool = False
              ) -> tuple[Task, dict[str, Any] | None, tuple[Any, ...] | None] | None:
    """Read `task_id` and mark it 'running' unless it is blocked or ended, in one round trip; return the task as
    it was before (its status decides whether the run goes on), its recorded agent configuration (None before
    its first step) and, `with_checkpoint`, its latest checkpoint's row (`checkpoints.COLUMNS`; None when it has
    none or it was not asked for), or None when there is no such task.

    The checkpoint is read in the same statement because every run reads it next (where to resume): one round
    trip less per run. Its row is returned raw: `CheckpointStore.decode` checks it.

    The commit does not wait for the WAL flush (`ASYNC_COMMIT`): 'running' only tells who looks that a worker has
    it, and a PostgreSQL or OS crash that loses it leaves the task 'pending', which is resumed the same way. The
    step's effect intent or checkpoint, both synchronous commits on this connection, flush it before anything
    irreversible or final happens.
    """
    latest = (f" LEFT JOIN LATERAL (SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE task_id = cur.id"  # noqa: S608
              " ORDER BY seq DESC LIMIT 1) cp ON true" if with_checkpoint else "")
    row = conn.execute(
        f"WITH cur AS (SELECT {_COLS}, agent_config FROM tasks WHERE id = %s),"  # noqa: S608
        " run AS (UPDATE tasks SET status = 'running', blocked_reason = NULL, blocked_detail = NULL,"
        " blocked_credential = NULL, updated_at = clock_timestamp() WHERE id = %s AND status <> ALL(%s))"
        f" SELECT cur.*, {async_commit(conn)}{', cp.*' if with_checkpoint else ''} FROM cur{latest}",
        (task_id, task_id, ["blocked", *ENDED])).fetchone()
    if row is None:
        return None
    # The task's columns, its configuration, the setting's column, then the checkpoint's (all NULL without one).
    first = len(_COLS.split(",")) + 2
    checkpoint = tuple(row[first:]) if with_checkpoint and row[first] is not None else None
    return Task(*row[:8]), (dict(row[8]) if row[8] is not None else None), checkpoint


def get(conn: psycopg.Connection, task_id: UUID) -> Task | None:
    row = conn.execute(f"SELECT {_COLS} FROM tasks WHERE id = %s", (task_id,)).fetchone()  # noqa: S608
    return Task(*row) if row else None


def config_record(conn: psycopg.Connection, task_id: UUID, fetch: Callable[[], dict[str, Any]], *,
                  read: bool = True, recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent configuration `task_id` runs with: the one recorded on its row, else `fetch()`'s, recorded first.

    Recorded once, before the first step: a replay after a crash finds the values the task started with, even if
    the customer's configuration changed since (the next task gets the new one). A concurrent recorder loses to
    the first write (``WHERE agent_config IS NULL``), and both then read the winner's. ``read=False``: the caller
    has just read the row (`start_run`) and passes what it holds as `recorded`, which saves reading it again.

    The record commits without waiting for the WAL flush (`ASYNC_COMMIT`): nothing acts on it before the step's
    first synchronous commit (an effect's intent, the checkpoint) flushes it, and a crash that loses it loses the
    step's work with it, so the resumed task records the configuration afresh.
    """
    if read:
        row = conn.execute("SELECT agent_config FROM tasks WHERE id = %s", (task_id,)).fetchone()
        recorded = row[0] if row is not None else None
    if recorded is not None:
        return dict(recorded)
    config = fetch()
    row = conn.execute(f"UPDATE tasks SET agent_config = %s WHERE id = %s AND agent_config IS NULL"  # noqa: S608
                       f" RETURNING agent_config, {async_commit(conn)}", (Jsonb(config), task_id)).fetchone()
    if row is None:  # another recorder won: its values are the task's
        row = conn.execute("SELECT agent_config FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return dict(row[0]) if row is not None and row[0] is not None else config


def config_recorded(conn: psycopg.Connection, task_id: UUID) -> dict[str, Any] | None:
    """The agent configuration recorded on `task_id`'s row (None before its first step): what its effects were
    built from, so an in-doubt effect is resolved against the same provider at boot."""
    row = conn.execute("SELECT agent_config FROM tasks WHERE id = %s", (task_id,)).fetchone()
    return dict(row[0]) if row is not None and row[0] is not None else None


def unfinished(conn: psycopg.Connection) -> list[Task]:
    """Tasks to run, interrupted ones ('running') first, then pending in submission order."""
    rows = conn.execute(
        f"SELECT {_COLS} FROM tasks WHERE status IN ('pending', 'running')"  # noqa: S608
        " ORDER BY (status = 'running') DESC, created_at, id"
    ).fetchall()
    return [Task(*r) for r in rows]


def unblock_known_kinds(conn: psycopg.Connection, kinds: list[str]) -> int:
    """Tasks blocked only because the instance then ran no agent of their kind (``unknown_kind``) run again
    once it does: the block was a fact about the agents loaded (a release without that kind, since rolled
    back or fixed), not a human decision. Each resumes from its checkpoint like any interrupted task."""
    done = conn.execute(
        "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"
        " updated_at = clock_timestamp() WHERE status = 'blocked' AND blocked_reason = 'unknown_kind'"
        " AND kind = ANY(%s)", (kinds,))
    return done.rowcount


def set_status(conn: psycopg.Connection, task_id: UUID, status: str, reason: str | None = None,
               detail: str | None = None, *, credential: str | None = None) -> None:
    """`credential`: the name of the credential a `credential_unavailable` block waits for (the provider, for a
    `connection_needs_reauth` block)."""
    conn.execute(
        "UPDATE tasks SET status = %s, blocked_reason = %s, blocked_detail = %s, blocked_credential = %s,"
        " updated_at = clock_timestamp()"
        # A cancel or a thread policy is final: nothing the worker does undoes it.
        " WHERE id = %s AND status <> ALL(%s)",
        (status, reason, detail, credential, task_id, list(ENDED_BY_REQUEST)),
    )
