"""Writes on schedules: create, change (pause and resume included), delete. Each is audited in its transaction.

The fire side (which times are due, the rows that make each fire happen once, the submission into the inbox)
is ``sweep.py``. Here the cursor (``next_fire_at``) is only ever *reset*, to the first fire time after the
moment of the change: a changed or resumed schedule does not run the times it was not running for.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.errors import Conflict, ValidationFailed
from controlplane.strict import free_json_validate
from conversations.services import KIND_RE, MAX_MESSAGE_CHARS, MAX_PARAMS_BYTES, validate_thread
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import OperatorToken, Tenant

from .choices import CATCH_UP_MAX_LIMIT, CatchUp, ScheduleStatus, TargetType
from .cron import CronInvalid, cron_validate, first_fire, zone_validate
from .models import Schedule
from .selectors import schedule_by_key

__all__ = ["schedule_create", "schedule_update", "schedule_delete", "misfire_grace", "NAME_RE",
           "MAX_SCHEDULES_PER_TENANT"]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:-]{0,99}$")
MAX_SCHEDULES_PER_TENANT = 100
# The fields whose change restarts the cursor from now.
_TIMING = ("cron", "timezone", "at")


def _invalid(field: str, message: str) -> ValidationFailed:
    """A 400 naming the field, in both shapes the API uses (``field`` and DRF's ``errors`` list)."""
    return ValidationFailed(f"{field}: {message}", extra={"field": field,
                                                          "errors": [{"field": field, "message": message}]})


def _target(task: dict[str, Any] | None, message: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The schedule's target, checked as the inbox will check it at each fire (so a fire is not refused later for
    something the schedule could have been refused for now)."""
    if (task is None) == (message is None):
        raise _invalid("task", "give exactly one of `task` (kind and params) or `message` (thread and content)")
    if task is not None:
        kind, params = task.get("kind"), task.get("params", {})
        if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
            raise _invalid("task.kind", "must be 1-100 characters of A-Z a-z 0-9 . _ -")
        if not isinstance(params, dict):
            raise _invalid("task.params", "must be a JSON object")
        if len(json.dumps(params)) > MAX_PARAMS_BYTES:
            raise _invalid("task.params", f"must be at most {MAX_PARAMS_BYTES} bytes of JSON")
        free_json_validate(params, "task.params")
        return TargetType.TASK, {"kind": kind, "params": params}
    assert message is not None
    thread, content = message.get("thread"), message.get("content")
    try:
        validate_thread(thread)
    except ValidationFailed as exc:
        raise _invalid("message.thread", exc.detail) from None
    if not isinstance(content, str) or not content.strip() or len(content) > MAX_MESSAGE_CHARS or "\x00" in content:
        raise _invalid("message.content", f"must be 1 to {MAX_MESSAGE_CHARS} characters, without NUL")
    return TargetType.MESSAGE, {"thread": thread, "content": content}


def _timing(*, cron: str | None, zone: str, at: datetime | None, now: datetime) -> tuple[str, str, datetime | None]:
    """(cron, zone, at) checked: exactly one of cron and at; a known zone; an ``at`` not in the past."""
    if (cron in (None, "")) == (at is None):
        raise _invalid("cron", "give exactly one of `cron` (repeating) or `at` (once)")
    try:
        zone_validate(zone)
    except CronInvalid as exc:
        raise _invalid("timezone", str(exc)) from None
    if cron:
        try:
            return cron_validate(cron), zone, None
        except CronInvalid as exc:
            raise _invalid("cron", str(exc)) from None
    assert at is not None
    if timezone.is_naive(at):
        raise _invalid("at", "must carry a UTC offset (e.g. 2026-12-24T08:00:00+01:00)")
    if at < now - timedelta(seconds=1):
        raise _invalid("at", "must not be in the past")
    return "", zone, at


def _cursor(schedule: Schedule, now: datetime) -> datetime | None:
    """Where an active schedule starts firing from ``now`` on."""
    if schedule.cron:
        return first_fire(schedule.cron, zone_validate(schedule.timezone), after=now)
    return schedule.at


def _catch_up(catch_up: str, catch_up_max: int) -> None:
    if catch_up not in CatchUp.values:
        raise _invalid("catch_up", f"must be one of {', '.join(CatchUp.values)}")
    if not 1 <= catch_up_max <= CATCH_UP_MAX_LIMIT:
        raise _invalid("catch_up_max", f"must be 1 to {CATCH_UP_MAX_LIMIT}")


def _audit_data(schedule: Schedule, **more: Any) -> dict[str, Any]:
    # Names and timing only: a message's content or a task's params may be the customer's data.
    return {"schedule": str(schedule.pk), "name": schedule.name, "cron": schedule.cron, "timezone": schedule.timezone,
            "at": schedule.at.isoformat() if schedule.at else None, "target_type": schedule.target_type,
            "catch_up": schedule.catch_up, "status": schedule.status, **more}


def schedule_create(*, tenant: Tenant, name: str, cron: str | None, timezone_name: str, at: datetime | None,
                    task: dict[str, Any] | None, message: dict[str, Any] | None, catch_up: str = CatchUp.LATEST,
                    catch_up_max: int = 10, paused: bool = False, actor: Actor,
                    token: OperatorToken | None = None, idempotency_key: str = "", created_by_task: str = "",
                    now: datetime | None = None) -> Schedule:
    """A new schedule; its first fire is the first cron time after ``now`` (or ``at``).

    With ``idempotency_key`` (the agent's ``ctx.schedule``: its effect's key) the tenant's schedule already made
    under that key is returned as it is, whatever else is asked: the same logical call, made again after a crash,
    creates nothing. Only schedules that can still fire count against the limit (a finished one-off is history)."""
    now = now or timezone.now()
    if idempotency_key:
        existing = schedule_by_key(tenant=tenant, key=idempotency_key)
        if existing is not None:
            return existing
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise _invalid("name", "must be 1-100 characters of A-Z a-z 0-9 space . _ : - (starting with a letter or "
                               "digit)")
    cron, zone, at = _timing(cron=cron, zone=timezone_name, at=at, now=now)
    target_type, target = _target(task, message)
    _catch_up(catch_up, catch_up_max)
    try:
        with transaction.atomic():
            # The count below, and the key's look-up, cannot race another create for this customer.
            Tenant.objects.select_for_update().filter(pk=tenant.pk).exists()
            if idempotency_key:
                existing = schedule_by_key(tenant=tenant, key=idempotency_key)
                if existing is not None:
                    return existing
            if (Schedule.objects.filter(tenant=tenant).exclude(status=ScheduleStatus.COMPLETED).count()
                    >= MAX_SCHEDULES_PER_TENANT):
                raise Conflict(f"a customer has at most {MAX_SCHEDULES_PER_TENANT} schedules that can still fire")
            schedule = Schedule(tenant=tenant, name=name, cron=cron, timezone=zone, at=at, target_type=target_type,
                                target=target, catch_up=catch_up, catch_up_max=catch_up_max, created_by=token,
                                idempotency_key=idempotency_key, created_by_task=created_by_task,
                                status=ScheduleStatus.PAUSED if paused else ScheduleStatus.ACTIVE)
            schedule.next_fire_at = None if paused else _cursor(schedule, now)
            schedule.save()
            audit_record(actor=actor, action=AuditAction.SCHEDULE_CREATE, target=schedule, tenant=tenant,
                         data=_audit_data(schedule, **({"task": created_by_task} if created_by_task else {})))
    except IntegrityError:
        raise Conflict(f"this customer already has a schedule named {name!r}") from None
    return schedule


def schedule_update(*, schedule: Schedule, changes: dict[str, Any], actor: Actor,
                    now: datetime | None = None) -> Schedule:
    """Apply a PATCH. Changing the timing, or resuming, restarts the cursor from ``now``: times that passed
    while paused (or under the old timing) are not fired. Pausing clears it; the sweep then ignores the row."""
    now = now or timezone.now()
    with transaction.atomic():
        # Waits for a sweep materialising this schedule (it holds the row), so the cursor is never moved back
        # under a fire it just created.
        locked = Schedule.objects.select_for_update().get(pk=schedule.pk)
        before = locked.status
        if "name" in changes:
            if not isinstance(changes["name"], str) or not NAME_RE.fullmatch(changes["name"]):
                raise _invalid("name", "must be 1-100 characters of A-Z a-z 0-9 space . _ : -")
            locked.name = changes["name"]
        timing_changed = any(k in changes for k in _TIMING)
        if timing_changed:
            cron = changes.get("cron", locked.cron if "at" not in changes else None)
            at = changes.get("at", locked.at if "cron" not in changes else None)
            locked.cron, locked.timezone, locked.at = _timing(
                cron=cron, zone=changes.get("timezone", locked.timezone), at=at, now=now)
        if "task" in changes or "message" in changes:
            locked.target_type, locked.target = _target(changes.get("task"), changes.get("message"))
        if "catch_up" in changes or "catch_up_max" in changes:
            locked.catch_up = changes.get("catch_up", locked.catch_up)
            locked.catch_up_max = changes.get("catch_up_max", locked.catch_up_max)
            _catch_up(locked.catch_up, locked.catch_up_max)
        if changes.get("paused") is True:
            locked.status, locked.next_fire_at = ScheduleStatus.PAUSED, None
        elif changes.get("paused") is False and locked.status == ScheduleStatus.PAUSED or (
                timing_changed and locked.status == ScheduleStatus.COMPLETED):
            locked.status = ScheduleStatus.ACTIVE
        if locked.status == ScheduleStatus.ACTIVE and (timing_changed or before != ScheduleStatus.ACTIVE):
            locked.next_fire_at = _cursor(locked, now)
            if not locked.cron and locked.at is not None and locked.at < now:
                # A one-off resumed after its moment: it passed while paused, which is not downtime.
                locked.status, locked.next_fire_at = ScheduleStatus.COMPLETED, None
        try:
            with transaction.atomic():
                locked.save()
        except IntegrityError:
            raise Conflict(f"this customer already has a schedule named {locked.name!r}") from None
        action = {ScheduleStatus.PAUSED: AuditAction.SCHEDULE_PAUSE, ScheduleStatus.ACTIVE: AuditAction.SCHEDULE_RESUME}
        audit_record(actor=actor, action=action[locked.status] if before != locked.status and locked.status in action
                     else AuditAction.SCHEDULE_UPDATE, target=locked, tenant=locked.tenant,
                     data=_audit_data(locked, changed=sorted(changes)))
    return locked


def schedule_delete(*, schedule: Schedule, actor: Actor) -> None:
    """Gone with its history. A fire already in the inbox stays there (it was accepted; the instance runs it)."""
    with transaction.atomic():
        audit_record(actor=actor, action=AuditAction.SCHEDULE_DELETE, target=schedule, tenant=schedule.tenant,
                     data=_audit_data(schedule))
        schedule.delete()


def misfire_grace() -> timedelta:
    """How late a fire time may be seen and still count as on time (older: missed, the catch-up policy decides)."""
    return timedelta(seconds=float(settings.SCHEDULES_MISFIRE_GRACE_S))
