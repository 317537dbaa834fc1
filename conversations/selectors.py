"""Reads: a thread, tasks, effects and logs, read from the tenant's instance (it holds them), plus inbox rows.

Query parameters are validated here, before anything is signed and sent.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Page, Paginator

from controlplane.errors import Conflict, NotFound, ValidationFailed
from controlplane.hostpaths import scrub_json
from instances.blocked_reasons import task_explained
from instances.client import InstanceClient, instance_client
from tenants.choices import TENANT_GONE, TenantStatus
from tenants.models import Operator, Tenant

from .choices import EffectState, InboxKind, InboxStatus, LogLevel, TaskStatus
from .models import InboxItem
from .services import HELD_TENANT, thread_policy, validate_task_id, validate_thread

__all__ = ["TenantSuspended", "InstanceNotReady", "tenant_for_operator", "tenants_with_pending_items",
           "tenant_has_pending_items", "thread_messages", "task_list", "task_detail",
           "effect_list", "log_tail", "LogPage", "log_search", "LOG_WINDOW", "LOG_PAGE_SIZE", "LOG_FOLLOW_WINDOW",
           "inbox_message_get", "inbox_item_end_user", "thread_setting"]


class TenantSuspended(Conflict):
    """A read while the tenant is suspended. Not a 503: nothing is down, the instance is stopped on purpose
    and retrying will not help until someone resumes it."""

    title = "Tenant suspended"
    type_slug = "tenant-suspended"

    def __init__(self) -> None:
        super().__init__("the tenant is suspended: resume it to read its instance (messages and tasks sent "
                         "meanwhile wait in the inbox)", extra={"code": "tenant_suspended"})


class InstanceNotReady(Conflict):
    """A read before the tenant's instance was ever provisioned (onboarding running or failed)."""

    title = "Instance not provisioned yet"
    type_slug = "instance-not-ready"

    def __init__(self, status: str) -> None:
        super().__init__(f"the tenant is {status}: its instance has not been provisioned yet",
                         extra={"code": "instance_not_ready"})


def tenant_for_operator(*, operator: Operator, tenant_id: object) -> Tenant:
    """``tenants.selectors.tenant_get(live=True)`` without the resources and instance it prefetches for the
    tenant API: one query on the proxy's hot path. Another operator's tenant is 404, like a missing one."""
    try:
        pk = uuid.UUID(str(tenant_id))
    except ValueError:
        raise NotFound("tenant not found") from None
    tenant = (Tenant.objects.select_related("operator").filter(operator=operator, pk=pk)
              .exclude(status__in=TENANT_GONE).first())
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant


def _reader(tenant: Tenant) -> InstanceClient:
    """The client for a read. The tenant's own state answers first (409) where no instance is meant to run;
    a 503 is left for an instance that should be up and is not (crashed, restarting, recovering)."""
    if tenant.status == TenantStatus.SUSPENDED:
        raise TenantSuspended()
    if tenant.status in HELD_TENANT:  # the rest of them: never provisioned (yet)
        raise InstanceNotReady(tenant.status)
    return instance_client(tenant)


def _int(value: object, name: str, lo: int, hi: int) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(str(value))
    except ValueError:
        raise ValidationFailed(f"{name} must be an integer") from None
    if not lo <= number <= hi:
        raise ValidationFailed(f"{name} must be {lo}-{hi}")
    return number


def thread_messages(*, tenant: Tenant, thread: str, after: object = None, before: object = None,
                    limit: object = None) -> dict[str, Any]:
    thread = validate_thread(thread)
    after_n, before_n = _int(after, "after", 0, 2**62), _int(before, "before", 1, 2**62)
    query = {"after": after_n, "before": before_n, "limit": _int(limit, "limit", 1, 200)}
    return _reader(tenant).request_json("GET", f"/v1/threads/{thread}/messages", query=query)[1]


def task_list(*, tenant: Tenant, status: object = None, limit: object = None, before: object = None
              ) -> dict[str, Any]:
    if status not in (None, "") and status not in TaskStatus.values:
        raise ValidationFailed(f"status must be one of: {', '.join(TaskStatus.values)}")
    before_id = validate_task_id(before) if before not in (None, "") else None
    query = {"status": status, "limit": _int(limit, "limit", 1, 200), "before": before_id}
    answer = scrub_json(_reader(tenant).request_json("GET", "/v1/tasks", query=query)[1])
    if isinstance(answer.get("tasks"), list):
        answer["tasks"] = [task_explained(t) if isinstance(t, dict) else t for t in answer["tasks"]]
    return answer


def task_detail(*, tenant: Tenant, task_id: str) -> dict[str, Any]:
    task_id = validate_task_id(task_id)
    answer = scrub_json(_reader(tenant).request_json("GET", f"/v1/tasks/{task_id}")[1])
    if isinstance(answer.get("task"), dict):
        answer["task"] = task_explained(answer["task"])
    return answer


def effect_list(*, tenant: Tenant, state: object = None, limit: object = None) -> dict[str, Any]:
    if state not in (None, "") and state not in EffectState.values:
        raise ValidationFailed(f"state must be one of: {', '.join(EffectState.values)}")
    query = {"state": state, "limit": _int(limit, "limit", 1, 200)}
    return scrub_json(_reader(tenant).request_json("GET", "/v1/effects", query=query)[1])


def log_tail(*, tenant: Tenant, limit: object = None, level: object = None) -> dict[str, Any]:
    if level not in (None, "") and level not in LogLevel.values:
        raise ValidationFailed(f"level must be one of: {', '.join(LogLevel.values)}")
    query = {"limit": _int(limit, "limit", 1, 2000), "level": level}
    return scrub_json(_reader(tenant).request_json("GET", "/v1/logs", query=query)[1])


# How many records a log screen searches: the instance keeps and answers at most this many (GET /v1/logs caps
# ``limit`` at 2,000, the size of its in-memory ring), so the search covers everything the instance can give.
LOG_WINDOW = 2000
LOG_PAGE_SIZE = 50
# A follow poll (every few seconds) reads a shorter tail: more records than this between two polls is a flood,
# and the page then says some were skipped (``window_full``) rather than reading 2,000 records each time.
LOG_FOLLOW_WINDOW = 500
# A record's own fields; the rest are its ``extra`` (event, task_id, error...), searched and shown as JSON.
_LOG_FIELDS = ("ts", "level", "logger", "msg")


@dataclass(frozen=True)
class LogPage:
    """One page of a log search, newest first.

    ``page`` holds the matching records (dicts: ``ts``, ``level``, ``logger``, ``msg``, ``extra`` as JSON text,
    ``task_id`` when the record names a valid task); ``newest_ts`` is the latest timestamp seen, what a follow
    poll sends back as ``since``; ``searched`` counts the records read from the instance and ``window_full``
    says older ones exist that no search can reach."""

    page: Page
    newest_ts: float | None
    searched: int
    window_full: bool


def _record_row(record: dict[str, Any]) -> dict[str, Any]:
    extra = {k: v for k, v in record.items() if k not in _LOG_FIELDS}
    task_id = ""
    for key in ("task_id", "task"):  # the runtime's records say task_id; a few older ones say task
        candidate = extra.get(key)
        if isinstance(candidate, str):
            try:
                task_id = validate_task_id(candidate)
            except NotFound:
                continue
            break
    ts = record.get("ts")
    return {"ts": float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None,
            "level": str(record.get("level", "")), "logger": str(record.get("logger", "")),
            "msg": str(record.get("msg", "")), "task_id": task_id,
            "extra": json.dumps(extra, sort_keys=True, default=str, ensure_ascii=False) if extra else ""}


def log_search(*, tenant: Tenant, q: str = "", level: str | None = None, page: object = 1,
               since: object = None, per_page: int = LOG_PAGE_SIZE) -> LogPage:
    """The instance's log, newest first, filtered by lowest ``level`` and by ``q`` (case-insensitive, in the
    message, the logger and the extra fields), paginated; with ``since`` (a Unix timestamp) only the records
    after it, unpaginated: what the screens' follow mode polls for.

    The instance answers only the tail (``LOG_WINDOW`` records, already redacted by its logger and scrubbed of
    host paths by ``log_tail``), so the search runs here on that tail; the instance's API stays a plain tail.
    Records without a timestamp (a line that was not JSON) are never "after" anything: a follow poll skips them.
    """
    after: float | None = None
    if since not in (None, ""):
        try:
            after = float(str(since))
        except ValueError:
            after = math.nan
        if not math.isfinite(after):
            raise ValidationFailed("since must be a Unix timestamp")
    window = LOG_WINDOW if after is None else LOG_FOLLOW_WINDOW
    records = log_tail(tenant=tenant, limit=window, level=level or None).get("records", [])
    rows = [_record_row(r) for r in records if isinstance(r, dict)]
    stamps = [r["ts"] for r in rows if r["ts"] is not None] + ([after] if after is not None else [])
    needle = q.strip().casefold()
    matching = [r for r in reversed(rows)
                if (not needle or needle in f"{r['msg']}\n{r['logger']}\n{r['extra']}".casefold())
                and (after is None or (r["ts"] is not None and r["ts"] > after))]
    paginator = Paginator(matching, per_page if after is None else max(len(matching), 1))
    return LogPage(page=paginator.get_page(page if after is None else 1), newest_ts=max(stamps, default=None),
                   searched=len(rows), window_full=len(records) >= window)


def inbox_message_get(*, tenant: Tenant, thread: str, message_id: str) -> InboxItem:
    """A message this tenant sent through the control plane; anything else is 404."""
    thread = validate_thread(thread)
    try:
        mid = validate_task_id(message_id)
    except NotFound:
        raise NotFound("message not found") from None
    item = InboxItem.objects.filter(tenant=tenant, kind=InboxKind.MESSAGE, thread=thread, pk=mid).first()
    if item is None:
        raise NotFound("message not found")
    return item


def inbox_item_end_user(*, tenant: Tenant, item_id: object) -> str | None:
    """The end user a message or task of ``tenant`` acts for, as the operator's API call recorded it; None when it
    named none, or when ``item_id`` is no message or task this tenant sent through the control plane (a task the
    agent started itself, another tenant's id, not a UUID). The id is the task's id at the instance."""
    try:
        pk = uuid.UUID(str(item_id))
    except ValueError:
        return None
    found: str | None = (InboxItem.objects.filter(tenant=tenant, pk=pk, kind__in=[InboxKind.MESSAGE, InboxKind.TASK])
                         .values_list("end_user", flat=True).first())
    return found


def tenants_with_pending_items() -> list[str]:
    """Ids of every tenant with something waiting in the inbox (one query on the status index)."""
    return [str(t) for t in InboxItem.objects.filter(status=InboxStatus.PENDING)
            .values_list("tenant_id", flat=True).distinct()]


def tenant_has_pending_items(*, tenant_id: object) -> bool:
    """One indexed EXISTS (tenant, status, created_at): cheap enough for every heartbeat."""
    return InboxItem.objects.filter(tenant_id=tenant_id, status=InboxStatus.PENDING).exists()


def thread_setting(*, tenant: Tenant, thread: str) -> dict[str, str]:
    """The thread's settings as the API shows them (the defaults for a thread never set)."""
    thread = validate_thread(thread)
    return {"thread": thread, "policy": thread_policy(tenant=tenant, thread=thread)}
