"""Reads: a tenant's schedules, one schedule, its next fire times and its fire history. No writes here."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import QuerySet

from controlplane.errors import NotFound
from tenants.models import Tenant

from .choices import NEXT_FIRES_SHOWN, ScheduleStatus
from .cron import next_fires, zone_validate
from .models import Schedule, ScheduleFire

__all__ = ["schedule_list", "schedule_get", "schedule_by_key", "schedule_next_fires", "fire_list"]


def schedule_list(*, tenant: Tenant) -> QuerySet[Schedule]:
    return Schedule.objects.filter(tenant=tenant).order_by("created_at", "id")


def schedule_get(*, tenant: Tenant, schedule_id: object) -> Schedule:
    """Scoped to the tenant (itself scoped to the caller's operator by the view): another tenant's schedule and
    one that does not exist are the same 404."""
    try:
        pk = uuid.UUID(str(schedule_id))
    except ValueError:
        raise NotFound("schedule not found") from None
    schedule = Schedule.objects.filter(tenant=tenant, pk=pk).first()
    if schedule is None:
        raise NotFound("schedule not found")
    return schedule


def schedule_by_key(*, tenant: Tenant, key: str) -> Schedule | None:
    """The schedule the tenant's agent made under this idempotency key (``ctx.schedule``), if any."""
    if not key:
        return None
    return Schedule.objects.filter(tenant=tenant, idempotency_key=key).first()


def schedule_next_fires(schedule: Schedule, *, count: int = NEXT_FIRES_SHOWN) -> list[datetime]:
    """The next fire times the sweep will create, from its cursor (a time already due but not yet swept is
    listed first); none while paused or completed."""
    if schedule.status != ScheduleStatus.ACTIVE or schedule.next_fire_at is None:
        return []
    if not schedule.cron:
        return [schedule.next_fire_at]
    return next_fires(schedule.cron, zone_validate(schedule.timezone), start=schedule.next_fire_at, count=count)


def fire_list(*, schedule: Schedule) -> QuerySet[ScheduleFire]:
    """Newest fire time first, with the inbox item each started (its id is the task's or message's id)."""
    return ScheduleFire.objects.filter(schedule=schedule).select_related("inbox_item").order_by("-fire_time", "id")
