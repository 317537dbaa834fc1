"""Reads: a thread, tasks, effects and logs, read from the tenant's instance (it holds them), plus inbox rows.

Query parameters are validated here, before anything is signed and sent.
"""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.errors import Conflict, NotFound, ValidationFailed
from controlplane.hostpaths import scrub_json
from instances.client import InstanceClient, instance_client
from tenants.choices import TENANT_GONE, TenantStatus
from tenants.models import Operator, Tenant

from .blocked_reasons import task_explained
from .choices import EffectState, InboxKind, InboxStatus, LogLevel, TaskStatus
from .models import InboxItem
from .services import HELD_TENANT, thread_policy, validate_task_id, validate_thread

__all__ = ["TenantSuspended", "InstanceNotReady", "tenant_for_operator", "tenants_with_pending_items",
           "tenant_has_pending_items", "thread_messages", "task_list", "task_detail",
           "effect_list", "log_tail", "inbox_message_get", "thread_setting"]


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
