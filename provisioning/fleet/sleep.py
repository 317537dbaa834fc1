"""Scale to zero: an instance idle for ``INSTANCE_IDLE_SUSPEND_S`` is stopped cleanly and marked ``asleep``; the
next message or task accepted for it wakes it (one boot however many arrive), and the inbox delivers after the
boot and read-back.

Idle is decided from durable facts only, cheapest first: the instance row (``last_activity_at``, bumped under
its row lock by every accepted inbox item and every wake), the registered activity sources (the inbox: nothing
pending or accepted within the window), no recovery under way, the last heartbeat not "working", and then the
tenant's own schema: no task pending or running, no effect whose intent has no outcome, and no task change,
message, effect or boot within the window. Everything an instance holds is durable already, so its stop loses nothing.

Concurrency: one lifecycle lock per instance (a PostgreSQL advisory lock) is held by the sleeper from the
decision until its stop has finished, and by the waker from the decision until its boot has finished, so a wake
that arrives while the instance is still stopping waits for the stop and then starts it: never a second process,
never asleep with an item waiting. The decisions themselves are made under the instance's row lock, which
``instance_activity`` (called by the inbox for every accepted item) takes too: either the item is seen by the
sleeper (no sleep) or the item sees ``asleep`` (a wake). The sweep also wakes any asleep instance with items
waiting and re-queues a wake whose task was lost.

Not here: the inbox itself (conversations, which registers it as an activity source in
``provisioning.resources.contributions`` and calls ``instance_activity`` for every item it accepts), the driver's
stop and start (drivers), any view.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.locks import AdvisoryLock
from provisioning.choices import InstanceStatus, RecoveryOutcome, WakeOutcome
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import runtime_driver
from provisioning.models import AgentInstance, InstanceWake
from provisioning.recovery.heartbeats import BUSY_STATUS, heartbeat_store
from provisioning.resources import runtime_tables
from provisioning.resources.contributions import activity_sources
from provisioning.resources.runtime_tables import SchemaActivity
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["SchemaActivity", "SleepSweepResult", "WakeLatency", "activity_nowait_sql", "instance_activity",
           "instance_activity_recorded", "instance_sleep", "instance_wake",
           "instance_wake_request", "instance_waking", "schema_activity", "sleep_candidates", "sleep_sweep",
           "wake_latency"]

log = logging.getLogger(__name__)

# Only a tenant meant to be up and not in trouble sleeps: a degraded one is left for staff to look at.
_SLEEPABLE_TENANT = (TenantStatus.READY,)
_WAKEABLE_TENANT = (TenantStatus.READY, TenantStatus.DEGRADED)
_ACTIVE_RECOVERY = (RecoveryOutcome.PENDING, RecoveryOutcome.RUNNING)
# A wake whose task has not reported for this long is queued again (its worker died before acking it).
WAKE_REQUEUE_AFTER_S = 60.0
_LOCK_POLL_S = 0.05


def _lifecycle_lock_name(instance_id: object) -> str:
    return f"instance-lifecycle:{instance_id}"


@contextmanager
def _lifecycle_lock(instance_id: object, *, wait_s: float) -> Iterator[bool]:
    """Hold the instance's lifecycle lock, waiting up to ``wait_s`` for its holder (a sleeper mid-stop)."""
    deadline = time.monotonic() + wait_s
    while True:
        with AdvisoryLock(_lifecycle_lock_name(instance_id)) as lock:
            if lock.held or time.monotonic() >= deadline:
                yield lock.held
                return
        time.sleep(_LOCK_POLL_S)


# --- the facts -------------------------------------------------------------------------------------------------

def schema_activity(tenant: Tenant) -> SchemaActivity:
    from provisioning.drivers.pg_admin import tenant_admin_connect

    with tenant_admin_connect(tenant, autocommit=True) as conn:
        return runtime_tables.activity(conn, tenant.resource_name)


def _quiet_in_control_plane(instance: AgentInstance, cutoff: datetime) -> str:
    """Why the control plane's own records say the instance is not idle ("" when they say it is)."""
    if instance.last_activity_at is not None and instance.last_activity_at >= cutoff:
        return "recent activity"
    for source in activity_sources():
        if (source.waiting().filter(tenant_id=instance.tenant_id).exists()
                or source.since(cutoff).filter(tenant_id=instance.tenant_id).exists()):
            return f"{source.name} pending or recent"
    if instance.recoveries.filter(outcome__in=_ACTIVE_RECOVERY).exists():
        return "a recovery is under way"
    return ""


def _sleeper() -> Callable[..., object] | None:
    """The runtime driver's ``sleep`` (stop and stay stopped), or None where it has none (``deferred``). A
    plain ``stop`` will not do: the Kubernetes driver's deletes the pod and its StatefulSet makes a new one
    (right for a recovery); its ``sleep`` scales the StatefulSet to zero replicas instead."""
    driver = runtime_driver()
    return driver.sleep if Capability.SLEEP in driver.capabilities else None


def sleep_candidates(*, idle_s: float, now: datetime | None = None, limit: int = 50) -> list[AgentInstance]:
    """Running instances the control plane's records show idle for ``idle_s`` (the schema is asked later)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=idle_s)
    candidates = (
        AgentInstance.objects.select_related("tenant", "tenant__operator")
        .filter(status=InstanceStatus.RUNNING, tenant__status__in=_SLEEPABLE_TENANT, created_at__lt=cutoff)
        .filter(Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=cutoff)))
    for source in activity_sources():
        candidates = (candidates.exclude(tenant_id__in=source.waiting().values("tenant_id"))
                      .exclude(tenant_id__in=source.since(cutoff).values("tenant_id")))
    return list(candidates.exclude(recoveries__outcome__in=_ACTIVE_RECOVERY).order_by("last_activity_at", "pk")[:limit])


# --- sleep -----------------------------------------------------------------------------------------------------

def instance_sleep(*, instance: AgentInstance, idle_s: float, now: datetime | None = None) -> str:
    """Put one instance to sleep if it is still idle; returns what was done (for the sweep's log and tests)."""
    sleep = _sleeper()
    if sleep is None:
        return "unsupported: this runtime driver cannot keep an instance stopped"
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=idle_s)
    with _lifecycle_lock(instance.pk, wait_s=0) as held:
        if not held:
            return "busy: its lifecycle lock is held"
        beat = heartbeat_store().get(str(instance.pk))
        if beat is not None and beat.progress.get("status") == BUSY_STATUS:
            return "busy: a step is in flight"
        activity = schema_activity(instance.tenant)
        if activity.busy():
            return (f"busy: {activity.unfinished_tasks} unfinished task(s), {activity.open_effects} effect(s) "
                    "in flight")
        if activity.last_activity_at is not None and activity.last_activity_at >= cutoff:
            return "active: its schema changed within the window"
        with transaction.atomic():
            locked = AgentInstance.objects.select_for_update().select_related("tenant").get(pk=instance.pk)
            if locked.status != InstanceStatus.RUNNING or locked.tenant.status not in _SLEEPABLE_TENANT:
                return f"not running ({locked.status})"
            why_not = _quiet_in_control_plane(locked, cutoff)
            if why_not:
                return f"active: {why_not}"
            # Marked before the stop, like every planned stop: the exit notice and the sweep then leave it alone.
            locked.status = InstanceStatus.ASLEEP
            locked.status_reason = f"falling asleep: idle for {int(idle_s)} s"
            locked.asleep_at = None
            locked.save(update_fields=["status", "status_reason", "asleep_at", "updated_at"])
            audit_record(actor=SYSTEM, action=AuditAction.INSTANCE_SLEEP, tenant=locked.tenant,
                         data={"idle_s": idle_s, "last_activity_at": str(activity.last_activity_at or "")})
        clean = sleep(tenant_spec(locked.tenant), grace_s=settings.RUNTIME_STOP_GRACE_S)  # None: the runtime records it
        heartbeat_store().forget(str(instance.pk))  # its last "stopped" beat would look stale later
        AgentInstance.objects.filter(pk=instance.pk, status=InstanceStatus.ASLEEP).update(
            asleep_at=timezone.now(), status_reason=f"asleep: idle for {int(idle_s)} s")
    log.info("instance asleep", extra={"event": "instance_asleep", "tenant_id": str(locked.tenant_id),
                                       "clean": clean})
    # An item accepted while it was stopping has asked for a wake already (its task waited for this lock).
    return "asleep"


@dataclass
class SleepSweepResult:
    ran: bool
    asleep: list[str] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)
    seconds: float = 0.0


def sleep_sweep(*, now: datetime | None = None) -> SleepSweepResult:
    """One pass (a singleton): put idle instances to sleep; wake asleep ones that have items waiting."""
    started = time.perf_counter()
    with AdvisoryLock("instance-sleep-sweep") as lock:
        if not lock.held:
            return SleepSweepResult(ran=False)
        result = SleepSweepResult(ran=True)
        result.woken = _wake_waiting(now=now)
        idle_s = float(settings.INSTANCE_IDLE_SUSPEND_S)
        if idle_s > 0 and _sleeper() is not None:
            for instance in sleep_candidates(idle_s=idle_s, now=now):
                try:
                    outcome = instance_sleep(instance=instance, idle_s=idle_s, now=now)
                except Exception:  # one tenant's unreachable schema must not keep the rest awake
                    log.exception("sleep check failed", extra={"event": "instance_sleep_failed",
                                                               "tenant_id": str(instance.tenant_id)})
                    continue
                if outcome == "asleep":
                    result.asleep.append(str(instance.pk))
        result.seconds = time.perf_counter() - started
        return result


def _wake_waiting(*, now: datetime | None) -> list[str]:
    """The safety net: an asleep instance with items pending gets a wake (and a lost wake task is queued again)."""
    now = now or timezone.now()
    woken: list[str] = []
    has_waiting = Q(pk__in=[])
    for source in activity_sources():
        has_waiting |= Q(tenant_id__in=source.waiting().values("tenant_id"))
    waiting = (AgentInstance.objects.select_related("tenant")
               .filter(has_waiting, status=InstanceStatus.ASLEEP, tenant__status__in=_WAKEABLE_TENANT))
    for instance in waiting:
        if instance_wake_request(tenant=instance.tenant, trigger="sweep"):
            woken.append(str(instance.pk))
    stale = InstanceWake.objects.filter(outcome=WakeOutcome.PENDING,
                                        requested_at__lt=now - timedelta(seconds=WAKE_REQUEUE_AFTER_S))
    for wake in stale:
        _queue_wake(wake.pk)
    return woken


# --- wake ------------------------------------------------------------------------------------------------------

def _queue_wake(wake_id: int) -> None:
    from provisioning.tasks import instance_wake_task

    transaction.on_commit(lambda: instance_wake_task.delay(wake_id))


def instance_activity(*, tenant: Tenant, trigger: str, accepted_at: datetime) -> bool:
    """The inbox accepted an item for ``tenant``: record the activity and, if its instance is asleep, ask for a
    wake. True when it is asleep (the item waits for the boot; do not try to deliver it now).

    Under the instance's row lock, so it is ordered against the sleeper's decision (see the module docstring).
    """
    with transaction.atomic():
        instance = AgentInstance.objects.select_for_update(no_key=True).filter(tenant=tenant).first()
        if instance is None:
            return False
        AgentInstance.objects.filter(pk=instance.pk).update(last_activity_at=timezone.now())
        if instance.status != InstanceStatus.ASLEEP:
            return False
        _wake_request_locked(instance=instance, trigger=trigger, accepted_at=accepted_at)
        return True


def activity_nowait_sql(*, tenant: Tenant) -> tuple[str, list[Any]]:
    """The statement that records ``tenant``'s activity inside the caller's transaction (the inbox's, so the item and
    its activity commit together), never waiting for the instance's row lock; it returns the row's (id, status), or
    no row when another transaction holds it (a sleeper deciding, a suspend) or there is no instance, and the caller
    then calls ``instance_activity`` after its commit, which waits as before. A CTE of the inbox's insert (one round
    trip fewer per message: issue 39); ``instance_activity_recorded`` reads its row.

    Never waiting is what keeps this from a lock cycle: the caller's transaction holds, or will take, the tenant's
    row (its inserts' keys, a quota's lock), and the sleeper locks the instance's row before the tenant's."""
    table = AgentInstance._meta.db_table
    return (f"UPDATE {table} SET last_activity_at = %s WHERE id = (SELECT id FROM {table} "  # noqa: S608
            "WHERE tenant_id = %s ORDER BY id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) RETURNING id, status",
            [timezone.now(), tenant.pk])


def instance_activity_recorded(*, tenant: Tenant, row: tuple[Any, str] | None, trigger: str,
                               accepted_at: datetime) -> bool | None:
    """What ``activity_nowait_sql``'s row means, in the caller's transaction: None when it took no row (the caller
    calls ``instance_activity`` after its commit), False when awake, True when asleep (a wake is asked)."""
    if row is None:
        return None
    if row[1] != InstanceStatus.ASLEEP:
        return False
    _wake_request_locked(instance=AgentInstance(pk=row[0], tenant_id=tenant.pk), trigger=trigger,
                         accepted_at=accepted_at)
    return True


def instance_wake_request(*, tenant: Tenant, trigger: str, accepted_at: datetime | None = None) -> bool:
    """Ask for a wake of ``tenant``'s instance if it is asleep; True if it is (one wake for any number of asks).

    ``accepted_at`` defaults to the oldest item waiting (in the inbox): the wake's latency counts from there."""
    if not AgentInstance.objects.filter(tenant=tenant, status=InstanceStatus.ASLEEP).exists():
        return False  # the common case (every delivery attempt asks), without a row lock
    if accepted_at is None:
        waiting = [at for source in activity_sources() if (at := source.oldest_waiting(tenant)) is not None]
        accepted_at = min(waiting, default=None) or timezone.now()
    with transaction.atomic():
        instance = AgentInstance.objects.select_for_update(no_key=True).filter(tenant=tenant).first()
        if instance is None or instance.status != InstanceStatus.ASLEEP:
            return False
        _wake_request_locked(instance=instance, trigger=trigger, accepted_at=accepted_at)
        return True


def _wake_request_locked(*, instance: AgentInstance, trigger: str, accepted_at: datetime) -> None:
    if InstanceWake.objects.filter(instance=instance, outcome=WakeOutcome.PENDING).exists():
        return  # a wake is on its way: the storm's other items ride on it
    wake = InstanceWake.objects.create(tenant_id=instance.tenant_id, instance=instance, trigger=trigger[:40],
                                       requested_at=accepted_at)
    _queue_wake(wake.pk)


def _wake_finish(wake: InstanceWake, outcome: str, error: str = "") -> str:
    InstanceWake.objects.filter(pk=wake.pk, outcome=WakeOutcome.PENDING).update(outcome=outcome, error=error[:2000])
    return outcome


def instance_wake(*, wake_id: int) -> str:
    """The wake itself (in a worker: it becomes the instance's parent): wait for a stop still under way, start
    the instance (``instance_start`` returns once it is ready, i.e. read back), then deliver what waits."""
    from provisioning.fleet.instances import instance_start

    wake = InstanceWake.objects.select_related("tenant").filter(pk=wake_id).first()
    if wake is None or wake.outcome != WakeOutcome.PENDING:
        return "nothing to do"
    tenant = wake.tenant
    from provisioning.databases.move import move_in_progress

    move = move_in_progress(tenant)
    if move is not None and move.switched_at is None:
        # Its database is being copied (the source is fenced): the task retries, and wakes it on the target.
        raise TimeoutError(f"the tenant's database is being moved to {move.target}")
    # A sleeper mid-stop holds the lock for at most the stop's grace plus the SIGKILL wait.
    with _lifecycle_lock(wake.instance_id, wait_s=settings.RUNTIME_STOP_GRACE_S + 15) as held:
        if not held:
            raise TimeoutError("the instance's lifecycle lock was not released in time")  # the task retries
        with transaction.atomic():
            instance = AgentInstance.objects.select_for_update().select_related("tenant").get(pk=wake.instance_id)
            if instance.status != InstanceStatus.ASLEEP or instance.tenant.status not in _WAKEABLE_TENANT:
                # Stopped on purpose, suspended, deprovisioned or woken already: not this wake's business.
                return _wake_finish(wake, WakeOutcome.CANCELLED, f"{instance.status}, tenant {instance.tenant.status}")
            instance.status = InstanceStatus.STARTING
            instance.status_reason = f"waking: {wake.trigger}"
            instance.asleep_at = None
            instance.save(update_fields=["status", "status_reason", "asleep_at", "updated_at"])
        try:
            instance_start(tenant=tenant, actor=SYSTEM)
        except Exception as exc:
            # Did not come back: failed, so the recovery sweep takes it (with its backoff and quarantine).
            AgentInstance.objects.filter(pk=wake.instance_id).update(
                status=InstanceStatus.FAILED, status_reason=f"wake failed: {exc}"[:2000])
            _wake_finish(wake, WakeOutcome.FAILED, str(exc))
            raise
        ready = timezone.now()
        AgentInstance.objects.filter(pk=wake.instance_id).update(last_activity_at=ready)
        InstanceWake.objects.filter(pk=wake.pk).update(outcome=WakeOutcome.SUCCEEDED, ready_at=ready)
        audit_record(actor=SYSTEM, action=AuditAction.INSTANCE_WAKE, tenant=tenant,
                     data={"trigger": wake.trigger, "boot_s": round((ready - wake.requested_at).total_seconds(), 3)})
    tenant.refresh_from_db()
    _deliver_waiting(wake, tenant)
    return WakeOutcome.SUCCEEDED


def _deliver_waiting(wake: InstanceWake, tenant: Tenant) -> None:
    """Deliver what waits, and record when the instance took the first item accepted since the wake was asked
    for (whoever delivered it)."""
    accepted_since = wake.requested_at - timedelta(seconds=1)
    delivered = [at for source in activity_sources() if (at := source.deliver(tenant, accepted_since)) is not None]
    first = min(delivered, default=None)
    if first is not None:
        InstanceWake.objects.filter(pk=wake.pk).update(delivered_at=max(first, wake.requested_at))


def instance_waking(tenant: Tenant, *, within_s: float = 60.0) -> bool:
    """Was a wake of ``tenant``'s instance asked for lately? A reply stream then polls its item more often, so
    the reply follows the boot at once rather than at the next one-second poll."""
    since = timezone.now() - timedelta(seconds=within_s)
    return InstanceWake.objects.filter(tenant=tenant, requested_at__gte=since).exists()


# --- reads for the dashboard -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WakeLatency:
    wakes: int
    boot_p50_s: float | None
    boot_p95_s: float | None
    delivery_p50_s: float | None
    asleep: int
    awake: int


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def wake_latency(*, recent: int = 50) -> WakeLatency:
    """p50/p95 of the last ``recent`` successful wakes (accepted -> ready, accepted -> delivered), and how many
    instances are asleep and awake now."""
    rows = list(InstanceWake.objects.filter(outcome=WakeOutcome.SUCCEEDED).order_by("-requested_at")[:recent])
    boots = sorted(w.boot_s for w in rows if w.boot_s is not None)
    deliveries = sorted(w.delivery_s for w in rows if w.delivery_s is not None)
    live = AgentInstance.objects.exclude(tenant__status=TenantStatus.DELETED)
    return WakeLatency(wakes=len(rows), boot_p50_s=_percentile(boots, 50), boot_p95_s=_percentile(boots, 95),
                       delivery_p50_s=_percentile(deliveries, 50),
                       asleep=live.filter(status=InstanceStatus.ASLEEP).count(),
                       awake=live.filter(status=InstanceStatus.RUNNING).count())
