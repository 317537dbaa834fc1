"""The sweep beat runs every few seconds: due fire times become ``ScheduleFire`` rows, and pending rows are
submitted into the tenant's durable inbox. Exactly once per fire time, whoever is killed when:

1. **Materialise** (one transaction): due schedules are locked ``FOR UPDATE SKIP LOCKED`` (a concurrent sweep
   takes other rows, never the same), their due times (``cron.due_fires``, the catch-up policy applied) are
   inserted as fire rows (unique on (schedule, fire time): a second insert is a no-op), and the cursor moves past
   ``now``. Killed before the commit: nothing happened, the next sweep does it. After: the rows are there.
2. **Dispatch** (per fire, under a PostgreSQL advisory lock on the fire, released by the server if the process
   dies): a still-pending fire is submitted with ``conversations.services.task_submit`` / ``message_send`` and
   the idempotency key ``schedule:<schedule id>:<fire time>``. The inbox commits the item (unique per key); a
   sweep killed after that and before marking the fire ``dispatched`` resubmits with the same key and gets the
   same item back, never a second one. Then each customer's inbox is delivered once (``inbox_deliver``: its items
   in order, under its delivery lock), not per fire; a sweep killed before that leaves the items to the inbox's
   own job. The instance dedupes by the item's id.

No patched clock anywhere: ``now`` is a parameter (beat passes none: the database server's time is not used,
the process's is). Fault-injection pauses (tests only) sit exactly between the steps a crash can split.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.config_table import FAULT_INJECTION_SWITCH
from controlplane.errors import ApplicationError
from controlplane.locks import AdvisoryLock
from conversations.services import Accepted, inbox_deliver, message_send, task_submit
from tenants.actors import Actor
from tenants.choices import TENANT_GONE, ActorKind
from tenants.models import Tenant

from .choices import FireStatus, ScheduleStatus, TargetType
from .cron import due_fires, due_once, zone_validate
from .models import Schedule, ScheduleFire
from .services import misfire_grace

__all__ = ["SweepResult", "fault_pause", "fire_dispatch", "fires_dispatch", "fires_materialize", "schedules_sweep"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepResult:
    created: int
    dispatched: int


def fault_pause(at: str) -> None:
    """Tests only: sleep ``SCHEDULES_PAUSE_S`` at ``SCHEDULES_PAUSE_AT`` so a chaos test can SIGKILL the sweep
    (or the agent asking for a schedule, ``schedules.api.internal``) exactly there. Refused (not ignored) without
    the fault-injection switch or in production, like ``controlplane.jobs.job_pause``."""
    seconds = float(getattr(settings, "SCHEDULES_PAUSE_S", 0) or 0)
    if not seconds or getattr(settings, "SCHEDULES_PAUSE_AT", "") != at:
        return
    if settings.PRODUCTION or not settings.CONTROLPLANE_FAULT_INJECTION:
        raise ImproperlyConfigured(f"SCHEDULES_PAUSE_S is a fault-injection setting: it needs "
                                   f"{FAULT_INJECTION_SWITCH}=1 and is refused in production (tests only)")
    time.sleep(seconds)


def schedules_sweep(*, now: datetime | None = None, limit: int = 500) -> SweepResult:
    """Materialise what is due at ``now``, then dispatch every pending fire (this sweep's and any a killed one
    left behind)."""
    now = now or timezone.now()
    created = fires_materialize(now=now, limit=limit)
    fault_pause("materialized")
    return SweepResult(created=created, dispatched=fires_dispatch(limit=limit))


def fires_materialize(*, now: datetime, limit: int = 500) -> int:
    """Create the fire rows due at ``now`` and move each schedule's cursor past it; returns the rows created."""
    grace = misfire_grace()
    created = 0
    with transaction.atomic():
        due = list(Schedule.objects.select_for_update(skip_locked=True, of=("self",))
                   .filter(status=ScheduleStatus.ACTIVE, next_fire_at__lte=now)
                   .exclude(tenant__status__in=TENANT_GONE).order_by("next_fire_at")[:limit])
        for schedule in due:
            cursor = schedule.next_fire_at
            assert cursor is not None
            if schedule.cron:
                plan = due_fires(expression=schedule.cron, zone=zone_validate(schedule.timezone), cursor=cursor,
                                 now=now, grace=grace, catch_up=schedule.catch_up,
                                 catch_up_max=schedule.catch_up_max)
            else:
                plan = due_once(at=cursor, now=now, grace=grace, catch_up=schedule.catch_up)
            rows = [ScheduleFire(schedule=schedule, tenant_id=schedule.tenant_id, fire_time=t,
                                 target_type=schedule.target_type, target=schedule.target) for t in plan.fire_times]
            # A conflict means this time was materialised already (it cannot be, with the cursor behind it and the
            # row locked; the constraint is the guarantee, not this comment).
            created += len(ScheduleFire.objects.bulk_create(rows, ignore_conflicts=True))
            schedule.next_fire_at = plan.next_fire_at
            schedule.skipped_fires += plan.skipped
            if plan.fire_times:
                schedule.last_fire_at = plan.fire_times[-1]
            if not schedule.cron and plan.next_fire_at is None:
                schedule.status = ScheduleStatus.COMPLETED
            schedule.save(update_fields=["next_fire_at", "skipped_fires", "last_fire_at", "status", "updated_at"])
    return created


# How long the sweep waits, once per customer, for another delivery of that customer's inbox to finish.
_DELIVERY_WAIT_S = 2.0


def fires_dispatch(*, limit: int = 500) -> int:
    """Submit pending fires, oldest first, into their customers' inboxes; then deliver each customer's inbox once
    (its items in order: one delivery pass per customer, not one per fire waiting for the customer's delivery lock).
    Returns how many fires this call dispatched (or failed for good)."""
    pending = list(ScheduleFire.objects.filter(status=FireStatus.PENDING)
                   .select_related("schedule", "tenant", "tenant__operator").order_by("fire_time", "id")[:limit])
    settled = 0
    tenants: dict[object, Tenant] = {}
    for fire in pending:
        if fire_dispatch(fire, deliver=False):
            settled += 1
            tenants[fire.tenant_id] = fire.tenant
    for tenant in tenants.values():
        try:
            inbox_deliver(tenant=tenant, wait_s=_DELIVERY_WAIT_S)
        except Exception:  # the instance client failing: the items wait in the inbox (its own job delivers them)
            log.exception("schedule fires of tenant %s accepted, not delivered yet", tenant.pk)
    return settled


def _actor(fire: ScheduleFire) -> Actor:
    return Actor(kind=ActorKind.SYSTEM, id=str(fire.schedule_id), label=f"schedule {fire.schedule.name}",
                 operator_id=str(fire.tenant.operator_id))


def _submit(fire: ScheduleFire, *, deliver: bool) -> Accepted:
    key, actor = fire.idempotency_key, _actor(fire)
    if fire.target_type == TargetType.TASK:
        return task_submit(tenant=fire.tenant, kind=fire.target["kind"], params=fire.target["params"],
                           idempotency_key=key, actor=actor, deliver=deliver)
    return message_send(tenant=fire.tenant, thread=fire.target["thread"], content=fire.target["content"],
                        idempotency_key=key, actor=actor, deliver=deliver)


def fire_dispatch(fire: ScheduleFire, *, deliver: bool = True) -> bool:
    """Submit one fire into the inbox unless another process holds it or finished it. True when this call
    settled it. Runs outside any transaction: the inbox must commit its item before it calls the instance.
    ``deliver=False``: the item is accepted (and an asleep instance asked to wake), delivered by the caller."""
    with AdvisoryLock(f"schedules.fire:{fire.pk}") as lock:
        if not lock.held:
            return False
        # Read again under the lock: a sweep that held it before us may have dispatched it.
        if not ScheduleFire.objects.filter(pk=fire.pk, status=FireStatus.PENDING).update(
                attempts=F("attempts") + 1):
            return False
        try:
            accepted = _submit(fire, deliver=deliver)
        except ApplicationError as exc:  # refused for good: quota, a tenant being deleted, a reused key
            ScheduleFire.objects.filter(pk=fire.pk, status=FireStatus.PENDING).update(
                status=FireStatus.FAILED, error=exc.detail[:500], dispatched_at=timezone.now())
            log.warning("schedule fire %s refused: %s", fire.pk, exc.detail)
            return True
        except Exception as exc:  # the database or the instance client failing: pending, the next sweep retries
            ScheduleFire.objects.filter(pk=fire.pk).update(error=f"{type(exc).__name__}: {exc}"[:500])
            log.exception("schedule fire %s not dispatched (retried by the next sweep)", fire.pk)
            return False
        fault_pause("submitted")
        ScheduleFire.objects.filter(pk=fire.pk, status=FireStatus.PENDING).update(
            status=FireStatus.DISPATCHED, inbox_item=accepted.item, dispatched_at=timezone.now(), error="")
        return True
