"""Events the instance, not the control plane, makes happen: a task done, blocked or failed, a reply committed.

The control plane is told nothing when an instance finishes a task: the inbox settles when the instance *accepts*
an item, heartbeats carry only what is running now, and the task list is asked on demand. What an instance has
finished is durable in its own tables (``tasks.status``/``updated_at``, ``messages`` with role ``assistant``),
read through ``provisioning.resources.runtime_tables`` like every other fact the control plane takes from there. So the
webhooks sweep (the beat job "Webhooks: queue deliveries that are due", every 60 s) first reads, for every tenant
with a schema, what changed since its cursor (``RuntimeEventCursor``), records one event per fact and moves the
cursor, in one transaction; then it queues due deliveries as before. No loop of its own.

Exactly once per fact: each event carries a ``fact_key`` (task id + status + when it reached that status; a
reply's seq + when it was written), unique per tenant, so a fact read again (the cursor's overlap, a sweep run
twice, two beats racing, a cursor reset) is not a second event. A task blocked, retried and blocked again is two
facts, two events. A tenant's first sweep starts at most ``FIRST_LOOKBACK`` back (or at its creation), so turning
this on does not announce a fleet's history.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from instances.blocked_reasons import blocked_reason_explain
from provisioning.resources import runtime_tables
from provisioning.resources.runtime_tables import Reply, TaskOutcome
from tenants.models import Tenant
from usage.services import usage_tenants

from .choices import EventType
from .models import RuntimeEventCursor
from .services import event_record

__all__ = ["FIRST_LOOKBACK", "OVERLAP", "RuntimeEventsResult", "runtime_events_detect", "runtime_events_tenant",
           "reply_event_data", "task_event"]

log = logging.getLogger(__name__)

# A runtime transaction stamps ``updated_at``/``created_at`` and commits moments later (one step's commit): rows
# are read again this far back, so one committed after the sweep passed its time is still seen.
OVERLAP = timedelta(seconds=120)
FIRST_LOOKBACK = timedelta(hours=1)
_BATCH = 500

_TASK_EVENTS = {"done": EventType.TASK_SUCCEEDED, "blocked": EventType.TASK_BLOCKED,
                "failed": EventType.TASK_FAILED}


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def task_event(task: TaskOutcome) -> tuple[str, dict[str, Any]]:
    """The event type and data of a task outcome: ids, kind, status; a block's code and its words from
    ``instances.blocked_reasons`` (the same words as the API and the screens), never the runtime's detail,
    which can name hosts, paths and what a provider answered."""
    data: dict[str, Any] = {"task": str(task.id), "kind": task.kind, "status": task.status, "at": _iso(task.at)}
    if task.thread:
        data["thread"] = task.thread
    if task.status == "blocked":
        explained = blocked_reason_explain(task.reason or "runtime_error")
        assert explained is not None  # noqa: S101 - a non-empty code always has words
        data.update(reason=task.reason or None, reason_text=explained.text, action=explained.action, retryable=True)
    elif task.status == "failed":
        data["retryable"] = True
    return _TASK_EVENTS[task.status], data


def reply_event_data(reply: Reply) -> dict[str, Any]:
    """``message.replied``: which message was answered, by which task, how long the reply is; not its text (an
    event carries ids and statuses; the reply is read through the API, with the customer's authority)."""
    data: dict[str, Any] = {"thread": reply.thread, "reply_seq": reply.seq, "chars": reply.chars,
                            "at": _iso(reply.at)}
    if reply.reply_to:
        data["message"] = reply.reply_to
    if reply.task:
        data["task"] = reply.task
    return data


@dataclass
class RuntimeEventsResult:
    tenants: int = 0  # read
    events: int = 0  # recorded (a fact already reported is not counted)
    skipped: int = 0  # tenants not read this time (their server away)


def runtime_events_tenant(*, tenant: Tenant, conn: psycopg.Connection[Any], now: datetime | None = None,
                          limit: int = _BATCH) -> int:
    """Read ``tenant``'s new task outcomes and replies on ``conn`` (the admin role on its server) and record
    their events; returns how many events are new. A schema the runtime never migrated has none yet."""
    now = now or timezone.now()
    cursor = RuntimeEventCursor.objects.filter(tenant=tenant).first()
    if cursor is None:
        start = max(tenant.created_at, now - FIRST_LOOKBACK)
        cursor = RuntimeEventCursor(tenant=tenant, tasks_after=start, replies_after=start)
    schema = tenant.resource_name
    try:
        tasks = runtime_tables.task_outcomes_since(conn, schema, cursor.tasks_after, overlap=OVERLAP, limit=limit)
        replies = runtime_tables.replies_since(conn, schema, cursor.replies_after, overlap=OVERLAP, limit=limit)
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        tasks, replies = [], []
    facts: list[tuple[datetime, str, str, dict[str, Any]]] = []
    for task in tasks:
        kind, data = task_event(task)
        facts.append((task.at, f"task:{task.id}:{task.status}:{_iso(task.at)}", kind, data))
    for reply in replies:
        facts.append((reply.at, f"reply:{reply.seq}:{_iso(reply.at)}", EventType.MESSAGE_REPLIED,
                      reply_event_data(reply)))
    facts.sort(key=lambda f: f[0])
    recorded = 0
    with transaction.atomic():
        # One sweep per tenant at a time moves the cursor; a racing one waits here, then finds the facts reported.
        RuntimeEventCursor.objects.bulk_create([cursor], ignore_conflicts=True)
        locked = RuntimeEventCursor.objects.select_for_update().get(tenant=tenant)
        for _, key, kind, data in facts:
            if event_record(operator_id=tenant.operator_id, tenant=tenant, type=kind, data=data,
                            fact_key=key) is not None:
                recorded += 1
        # Only past rows read in full: the newest time seen among those after the cursor (the overlap rows are
        # behind it already), so a batch cut at ``limit`` continues where it stopped.
        locked.tasks_after = max([locked.tasks_after, *(t.at for t in tasks if t.at > cursor.tasks_after)])
        locked.replies_after = max([locked.replies_after, *(r.at for r in replies if r.at > cursor.replies_after)])
        locked.save(update_fields=["tasks_after", "replies_after", "polled_at"])
    return recorded


def runtime_events_detect(*, now: datetime | None = None) -> RuntimeEventsResult:
    """The sweep's first half: every tenant with a schema, read on one admin connection per database server.
    A server that cannot be reached is logged and skipped (its tenants are read at the next sweep, from their
    cursors: late, never lost)."""
    from provisioning.databases.servers import tenant_database_server
    from provisioning.drivers.pg_admin import admin_connect

    result = RuntimeEventsResult()
    if not settings.WEBHOOK_RUNTIME_EVENTS:
        return result
    by_server: dict[str, list[Tenant]] = defaultdict(list)
    for tenant in usage_tenants().select_related("operator"):
        by_server[tenant_database_server(tenant).name].append(tenant)
    for server, tenants in by_server.items():
        read = 0
        try:
            with admin_connect(server, autocommit=True) as conn:
                for tenant in tenants:
                    try:
                        result.events += runtime_events_tenant(tenant=tenant, conn=conn, now=now)
                        read += 1
                    except psycopg.Error as exc:
                        if conn.closed:
                            raise
                        log.warning("webhooks: runtime events of tenant %s not read: %s", tenant.pk,
                                    type(exc).__name__)
        except (psycopg.Error, OSError) as exc:
            log.warning("webhooks: runtime events of server %s not read: %s", server or "default",
                        type(exc).__name__)
        result.tenants += read
        result.skipped += len(tenants) - read
    return result
