"""The control plane's one reader of the runtime's tables in a tenant's schema.

The instance API (``docs/instance-api.md``) is how the control plane talks to a live instance. A few
decisions need facts the instance may not be up to give, or that must be read the same way whether it is up
or not: did it boot (and on which release), did it shut down cleanly, is it busy, what did a crash lose, did
an upgrade fail tasks. Those are read straight from the runtime's own tables with the admin connection, and
every such query lives here, nowhere else in the control plane: a runtime migration that renames a column is
then one file to change, and ``tests/provisioning/test_runtime_tables_contract.py`` runs every function below against a
schema migrated by agent_runtime's latest migration (and fails when any other control-plane module names a
runtime table in SQL).

Each function takes an open connection to the server holding the schema (the caller picks admin or failover
connection and autocommit) and the schema's name, and says in its docstring which tables and columns it
depends on. Reads only, except ``lease_expire_now``. Nothing here imports agent code or Django: the table
and column names are the runtime's documented schema (``agent_runtime/state/migrations.py``), not its code.
Errors are psycopg's: ``UndefinedTable`` (or ``InvalidSchemaName``) before the instance's first boot, for
the caller to decide what that means.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg import sql

__all__ = ["BootsSince", "Checkpoint", "DayUsage", "Reply", "SchemaActivity", "StepsDoneAround", "TaskOutcome",
           "TaskProblem", "activity", "replies_since", "task_outcomes_since",
           "boot_count", "boots_since", "checkpoint_before", "effects_in_trouble_since", "first_step_start_since",
           "last_event_at", "latest_boots", "lease_expire_now", "release_crossings_since", "restarts_since",
           "schema_bytes", "steps_done_around", "steps_in_flight", "task_counts", "task_problems_since",
           "usage_by_day"]

Conn = psycopg.Connection[Any]


def _id(schema: str) -> sql.Identifier:
    return sql.Identifier(schema)


# --- host_events: the instance's own record of boots, crashes and clean shutdowns ---------------------------

def last_event_at(conn: Conn, schema: str, kind: str) -> datetime | None:
    """When the instance last wrote a ``kind`` event (``boot``, ``clean_shutdown``, ...), None if never.

    Depends on ``host_events(kind, at)``."""
    row = conn.execute(sql.SQL("SELECT max(at) FROM {}.host_events WHERE kind = %s").format(_id(schema)),
                       (kind,)).fetchone()
    return row[0] if row else None


def boot_count(conn: Conn, schema: str) -> int:
    """How many times the instance booted. Depends on ``host_events(kind)``."""
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.host_events WHERE kind = 'boot'").format(
        _id(schema))).fetchone()
    return int(row[0]) if row else 0


def latest_boots(conn: Conn, schema: str, *, limit: int = 2) -> list[datetime]:
    """The instance's latest boots, newest first. Depends on ``host_events(id, kind, at)``."""
    rows = conn.execute(sql.SQL("SELECT at FROM {}.host_events WHERE kind = 'boot' ORDER BY id DESC LIMIT %s")
                        .format(_id(schema)), (limit,)).fetchall()
    return [r[0] for r in rows]


class BootsSince(NamedTuple):
    boots: int
    release: dict[str, Any] | None  # what the latest of them says it loaded (None: no boot, or no release)


def boots_since(conn: Conn, schema: str, since: datetime | None) -> BootsSince:
    """Boots since ``since`` (None: ever) and the release the latest one names: what it really loaded.

    Depends on ``host_events(id, kind, at, detail)`` and ``detail -> 'release'`` of a boot row."""
    row = conn.execute(sql.SQL(
        "SELECT count(*), (array_agg(detail -> 'release' ORDER BY id DESC))[1] FROM {}.host_events"
        " WHERE kind = 'boot' AND (%s::timestamptz IS NULL OR at >= %s)"
    ).format(_id(schema)), (since, since)).fetchone()
    return BootsSince(int(row[0]), row[1]) if row else BootsSince(0, None)


def restarts_since(conn: Conn, schema: str, since: datetime) -> int:
    """Boots and crashes after ``since`` (an upgraded instance should have none). Depends on
    ``host_events(kind, at)``."""
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.host_events WHERE kind IN ('boot', 'crash') AND at > %s")
                       .format(_id(schema)), (since,)).fetchone()
    return int(row[0]) if row else 0


# --- host_lease: the single-writer lease -----------------------------------------------------------------------

def lease_expire_now(conn: Conn, schema: str) -> bool:
    """End a live lease now, so a pooled instance's successor need not wait its TTL; True if one was live.

    The one write here (see ``provisioning.recovery.steps``: only after the holder was stopped). False when the
    schema has no lease table (never booted). Depends on ``host_lease(expires_at)``."""
    table = conn.execute("SELECT to_regclass(quote_ident(%s) || '.host_lease')", (schema,)).fetchone()
    if table is None or table[0] is None:
        return False
    cur = conn.execute(sql.SQL("UPDATE {}.host_lease SET expires_at = clock_timestamp()"
                               " WHERE expires_at > clock_timestamp()").format(_id(schema)))
    return cur.rowcount > 0


# --- tasks, effects, messages: is the instance busy, did an upgrade hurt it ----------------------------------

def task_counts(conn: Conn, schema: str) -> dict[str, int]:
    """The instance's tasks counted by status. Depends on ``tasks(status)``."""
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {}.tasks GROUP BY status").format(
        _id(schema))).fetchall()
    return {status: int(n) for status, n in rows}


@dataclass(frozen=True)
class SchemaActivity:
    """What the tenant's own schema says about its instance's work (read with the admin connection)."""

    unfinished_tasks: int  # pending or running (a message being answered is a task too)
    open_effects: int  # an intent with no outcome yet (blocked ones wait for a human, through the inbox)
    last_activity_at: datetime | None  # newest task change, message, effect or boot

    def busy(self) -> bool:
        return self.unfinished_tasks > 0 or self.open_effects > 0


def activity(conn: Conn, schema: str) -> SchemaActivity:
    """Unfinished tasks, open effects and the newest change, in one query (the sleep sweep's schema check).

    Depends on ``tasks(status, updated_at)``, ``effects(state, created_at, settled_at)``,
    ``messages(created_at)`` and ``host_events(kind, at)``."""
    query = sql.SQL(
        "SELECT (SELECT count(*) FROM {s}.tasks WHERE status IN ('pending', 'running')),"
        " (SELECT count(*) FROM {s}.effects WHERE state = 'intent'),"
        " GREATEST((SELECT max(updated_at) FROM {s}.tasks), (SELECT max(created_at) FROM {s}.messages),"
        "          (SELECT max(COALESCE(settled_at, created_at)) FROM {s}.effects),"
        "          (SELECT max(at) FROM {s}.host_events WHERE kind = 'boot'))").format(s=_id(schema))
    row = conn.execute(query).fetchone()
    assert row is not None  # noqa: S101 - a SELECT of scalar subqueries always returns its one row
    tasks, effects, last = row
    return SchemaActivity(unfinished_tasks=int(tasks), open_effects=int(effects), last_activity_at=last)


class TaskProblem(NamedTuple):
    status: str  # failed or blocked
    reason: str  # blocked_reason, "" when none
    tasks: int


def task_problems_since(conn: Conn, schema: str, since: datetime) -> list[TaskProblem]:
    """Tasks failed or blocked since ``since``, counted by status and reason.

    Depends on ``tasks(status, blocked_reason, updated_at)``."""
    rows = conn.execute(sql.SQL(
        "SELECT status, coalesce(blocked_reason, ''), count(*) FROM {}.tasks"
        " WHERE status IN ('failed', 'blocked') AND updated_at >= %s GROUP BY 1, 2").format(_id(schema)),
        (since,)).fetchall()
    return [TaskProblem(status, reason, int(n)) for status, reason, n in rows]


class TaskOutcome(NamedTuple):
    id: UUID
    kind: str
    status: str  # done, blocked or failed
    reason: str  # blocked_reason, "" when none
    thread: str  # the thread of a message's task, "" for a submitted task
    at: datetime  # updated_at: when it reached this status


# The outcomes the webhooks report (``webhooks.runtime_events``); cancelled, interrupted and rolled back are ended
# by a request the control plane already announced.
_OUTCOMES = ("done", "blocked", "failed")


def task_outcomes_since(conn: Conn, schema: str, after: datetime, *, overlap: timedelta, limit: int = 500
                        ) -> list[TaskOutcome]:
    """Tasks that reached done, blocked or failed after ``after`` (oldest first, at most ``limit``), and those of
    the ``overlap`` before it (at most ``limit`` more): a transaction that stamped ``updated_at`` and committed
    later than a reader passed that time is still seen. The caller de-duplicates.

    Depends on ``tasks(id, kind, params, status, blocked_reason, updated_at)``."""
    rows = conn.execute(sql.SQL(
        "(SELECT id, kind, status, coalesce(blocked_reason, ''), coalesce(params->>'thread', ''), updated_at"
        " FROM {s}.tasks WHERE status = ANY(%(st)s) AND updated_at > %(after)s ORDER BY updated_at, id LIMIT %(n)s)"
        " UNION ALL (SELECT id, kind, status, coalesce(blocked_reason, ''), coalesce(params->>'thread', ''),"
        " updated_at FROM {s}.tasks WHERE status = ANY(%(st)s) AND updated_at > %(from)s AND updated_at <= %(after)s"
        " ORDER BY updated_at DESC LIMIT %(n)s)").format(s=_id(schema)),
        {"st": list(_OUTCOMES), "after": after, "from": after - overlap, "n": limit}).fetchall()
    return sorted((TaskOutcome(*r) for r in rows), key=lambda t: (t.at, str(t.id)))


class Reply(NamedTuple):
    seq: int
    thread: str
    task: str  # the task that answered, "" when the agent did not say
    reply_to: str  # the message (inbox item) id answered, "" when none
    chars: int
    at: datetime


def replies_since(conn: Conn, schema: str, after: datetime, *, overlap: timedelta, limit: int = 500) -> list[Reply]:
    """The agent's committed replies (``ctx.reply``) after ``after``, with the ``overlap`` before it, oldest first;
    as ``task_outcomes_since``. Depends on ``messages(seq, thread, role, metadata, content, created_at)``."""
    rows = conn.execute(sql.SQL(
        "(SELECT seq, thread, coalesce(metadata->>'task', ''), coalesce(metadata->>'reply_to', ''),"
        " char_length(content), created_at FROM {s}.messages WHERE role = 'assistant' AND created_at > %(after)s"
        " ORDER BY created_at, seq LIMIT %(n)s)"
        " UNION ALL (SELECT seq, thread, coalesce(metadata->>'task', ''), coalesce(metadata->>'reply_to', ''),"
        " char_length(content), created_at FROM {s}.messages WHERE role = 'assistant' AND created_at > %(from)s"
        " AND created_at <= %(after)s ORDER BY created_at DESC LIMIT %(n)s)").format(s=_id(schema)),
        {"after": after, "from": after - overlap, "n": limit}).fetchall()
    return sorted((Reply(*r) for r in rows), key=lambda m: (m.at, m.seq))


def release_crossings_since(conn: Conn, schema: str, since: datetime) -> int:
    """Tasks that moved from the release they started on to another since ``since`` (an agent declaring its steps
    compatible, or an operator's retry): what a rollout's health gate counts as crossing versions.

    Depends on ``step_events(task_id, event = 'release_crossed', at)``."""
    row = conn.execute(sql.SQL(
        "SELECT count(DISTINCT task_id) FROM {}.step_events WHERE event = 'release_crossed' AND at >= %s").format(
            _id(schema)), (since,)).fetchone()
    return int(row[0]) if row else 0


def effects_in_trouble_since(conn: Conn, schema: str, since: datetime, *, in_doubt_after: timedelta) -> int:
    """Effects blocked since ``since``, or begun since then and without an outcome for ``in_doubt_after``.

    Depends on ``effects(state, created_at, settled_at)``."""
    row = conn.execute(sql.SQL(
        "SELECT count(*) FROM {}.effects WHERE (state = 'blocked' AND coalesce(settled_at, created_at) >= %s)"
        " OR (state = 'intent' AND created_at >= %s AND created_at < now() - %s)").format(_id(schema)),
        (since, since, in_doubt_after)).fetchone()
    return int(row[0]) if row else 0


# --- checkpoints, step_events: what a restart resumed from and what it lost ----------------------------------

class Checkpoint(NamedTuple):
    id: int
    task_id: UUID
    step: str


def checkpoint_before(conn: Conn, schema: str, at: datetime) -> Checkpoint | None:
    """The newest checkpoint written before ``at`` (what a boot at ``at`` resumed from).

    Depends on ``checkpoints(id, task_id, step, created_at)``."""
    row = conn.execute(sql.SQL(
        "SELECT id, task_id, step FROM {}.checkpoints WHERE created_at < %s ORDER BY id DESC LIMIT 1"
    ).format(_id(schema)), (at,)).fetchone()
    return Checkpoint(*row) if row else None


def steps_in_flight(conn: Conn, schema: str, *, boot_at: datetime, previous_boot: datetime | None) -> int:
    """Steps in flight at a crash: started since the previous boot and never finished before this one.

    Depends on ``step_events(id, task_id, step, event, at)`` and its events ``start``, ``done``, ``failed``,
    ``abandoned``."""
    row = conn.execute(sql.SQL(
        """SELECT count(*) FROM {s}.step_events st
           WHERE st.event = 'start' AND st.at < %(boot)s AND st.at > %(prev)s
             AND NOT EXISTS (SELECT 1 FROM {s}.step_events fin
                             WHERE fin.task_id = st.task_id AND fin.step = st.step AND fin.id > st.id
                               AND fin.event IN ('done', 'failed', 'abandoned') AND fin.at < %(boot)s)"""
    ).format(s=_id(schema)), {"boot": boot_at, "prev": previous_boot or datetime.min.replace(tzinfo=UTC)}
    ).fetchone()
    return int(row[0]) if row else 0


def first_step_start_since(conn: Conn, schema: str, at: datetime) -> datetime | None:
    """When the first step started at or after ``at`` (a restarted instance resumed). Depends on
    ``step_events(event, at)``."""
    row = conn.execute(sql.SQL("SELECT min(at) FROM {}.step_events WHERE event = 'start' AND at >= %s")
                       .format(_id(schema)), (at,)).fetchone()
    return row[0] if row else None


class StepsDoneAround(NamedTuple):
    last_before: datetime | None  # the last step done at or before the moment
    first_after: datetime | None  # the first one done after it


def steps_done_around(conn: Conn, schema: str, at: datetime) -> StepsDoneAround:
    """The last step finished at or before ``at`` and the first one after (a switch's downtime).

    Depends on ``step_events(event, at)``."""
    row = conn.execute(sql.SQL(
        "SELECT (SELECT max(at) FROM {s}.step_events WHERE event = 'done' AND at <= %s),"
        " (SELECT min(at) FROM {s}.step_events WHERE event = 'done' AND at > %s)"
    ).format(s=_id(schema)), (at, at)).fetchone()
    return StepsDoneAround(row[0], row[1]) if row else StepsDoneAround(None, None)


# --- usage: what an operator bills its customer for ------------------------------------------------------------

@dataclass
class DayUsage:
    """One UTC day of a tenant's work, counted from the runtime's own records (the instance API is not asked:
    a sleeping instance's usage is read the same way)."""

    day: date
    tasks_submitted: int = 0  # created that day
    tasks_done: int = 0  # finished that day (their last change)
    tasks_failed: int = 0
    steps_run: int = 0  # step attempts started that day
    compute_s: float = 0.0  # step attempts that ended that day: start -> the event that ended it
    messages_in: int = 0  # the customer's messages to the agent
    messages_out: int = 0  # the agent's replies
    effects_committed: int = 0  # irreversible effects that happened that day
    tokens: dict[str, tuple[int, int]] | None = None  # model -> (input, output), from ``ctx.usage`` reports


# An attempt ends with the next of these events for its (task, step): done, failed, abandoned (our planned stop),
# waiting (an effect in doubt), hung (killed for no progress). A start followed by another start was cut short by
# a crash: how long it ran is unknown, so it is not counted.
# A step attempt that ends in the window may have started before it.
_STEP_LOOKBACK = timedelta(days=7)


def usage_by_day(conn: Conn, schema: str, since: date, until: date) -> dict[date, DayUsage]:
    """The tenant's usage for each UTC day from ``since`` up to, not including, ``until``, in one query (days
    with nothing in them are absent).

    Depends on ``tasks(status, created_at, updated_at)``, ``step_events(id, task_id, step, event, at)``,
    ``messages(role, created_at)``, ``effects(state, settled_at)`` and ``model_usage(model, input_tokens,
    output_tokens, at)``."""
    start = datetime(since.year, since.month, since.day, tzinfo=UTC)
    end = datetime(until.year, until.month, until.day, tzinfo=UTC)
    query = sql.SQL(
        "SELECT (created_at AT TIME ZONE 'UTC')::date, 'tasks_submitted', '', count(*), 0 FROM {s}.tasks"
        " WHERE created_at >= %(start)s AND created_at < %(end)s GROUP BY 1"
        " UNION ALL SELECT (updated_at AT TIME ZONE 'UTC')::date, 'tasks_' || status, '', count(*), 0 FROM {s}.tasks"
        " WHERE status IN ('done', 'failed') AND updated_at >= %(start)s AND updated_at < %(end)s GROUP BY 1, 2"
        " UNION ALL SELECT (at AT TIME ZONE 'UTC')::date, 'steps_run', '', count(*), 0 FROM {s}.step_events"
        " WHERE event = 'start' AND at >= %(start)s AND at < %(end)s GROUP BY 1"
        " UNION ALL SELECT (at AT TIME ZONE 'UTC')::date, 'compute_s', '', sum(extract(epoch FROM at - began)), 0"
        " FROM (SELECT event, at, lag(event) OVER w AS before, lag(at) OVER w AS began FROM {s}.step_events"
        "       WHERE event IN ('start', 'done', 'failed', 'abandoned', 'waiting', 'hung')"
        "         AND at >= %(lookback)s AND at < %(end)s WINDOW w AS (PARTITION BY task_id, step ORDER BY id)) attempt"
        " WHERE event <> 'start' AND before = 'start' AND at >= %(start)s GROUP BY 1"
        " UNION ALL SELECT (created_at AT TIME ZONE 'UTC')::date, 'messages_' || role, '', count(*), 0"
        " FROM {s}.messages WHERE role IN ('user', 'assistant') AND created_at >= %(start)s AND created_at < %(end)s"
        " GROUP BY 1, 2"
        " UNION ALL SELECT (settled_at AT TIME ZONE 'UTC')::date, 'effects_committed', '', count(*), 0 FROM {s}.effects"
        " WHERE state = 'committed' AND settled_at >= %(start)s AND settled_at < %(end)s GROUP BY 1"
        " UNION ALL SELECT (at AT TIME ZONE 'UTC')::date, 'tokens', model, sum(input_tokens), sum(output_tokens)"
        " FROM {s}.model_usage WHERE at >= %(start)s AND at < %(end)s GROUP BY 1, 3"
    ).format(s=_id(schema))
    rows = conn.execute(query, {"start": start, "end": end, "lookback": start - _STEP_LOOKBACK}).fetchall()
    names = {"messages_user": "messages_in", "messages_assistant": "messages_out"}
    days: dict[date, DayUsage] = {}
    for when, metric, model, value, second in rows:
        usage = days.setdefault(when, DayUsage(when))
        if metric == "tokens":
            usage.tokens = {**(usage.tokens or {}), model: (int(value), int(second))}
        elif metric == "compute_s":
            usage.compute_s = float(value or 0)
        else:
            setattr(usage, names.get(metric, metric), int(value))
    return days


def schema_bytes(conn: Conn, schema: str) -> int:
    """What the tenant's schema occupies on disk now: its tables with their indexes and TOAST. Reads the catalog
    only (``pg_class``), so it depends on no runtime table; it lives here with the other reads of the schema."""
    row = conn.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                       " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                       (schema,)).fetchone()
    return int(row[0]) if row else 0
