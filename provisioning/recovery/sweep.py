"""Scheduled recovery: find dead, hung, drifted and unhealthy instances and recover each one once.

The sweep is a singleton (PostgreSQL advisory lock); detection reads the heartbeat store's
sorted sets, so its cost grows with the number of stale instances, not the fleet. Each
recovery is a ``recover`` workflow run (stop → repair → start → verify) with a
``RecoveryEvent``; failures back off exponentially and, after ``RECOVERY_MAX_FAILURES`` in
``RECOVERY_FAILURE_WINDOW_S``, quarantine the instance (tenant ``degraded``) until staff retry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.errors import Conflict
from controlplane.locks import AdvisoryLock
from provisioning.choices import (
    InstanceStatus,
    RecoveryOutcome,
    RecoveryReason,
    ResourceKind,
    ResourceStatus,
    WorkflowKind,
)
from provisioning.drivers.base import Ref
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import driver_for, runtime_driver
from provisioning.models import AgentInstance, ProvisionedResource, RecoveryEvent, WorkflowRun
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.resources.kinds import resource_kind
from provisioning.resources.spec import tenant_spec
from provisioning.services import workflow_start
from provisioning.workflows.steps import runtime_resource_mark
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition

__all__ = [
    "SweepResult", "recovery_candidates", "recovery_sweep", "recovery_start", "recovery_failed", "recovery_retry",
    "drift_check",
]

_ACTIVE = (RecoveryOutcome.PENDING, RecoveryOutcome.RUNNING)
# Only instances meant to run: never a stopped or an asleep one (provisioning/fleet/sleep.py marks it asleep before
# its stop, and its last heartbeat, forgotten after the stop, would otherwise look stale), never one recovering.
_SWEEPABLE_INSTANCE = (InstanceStatus.RUNNING, InstanceStatus.FAILED)
_SWEEPABLE_TENANT = (TenantStatus.READY, TenantStatus.DEGRADED)
# The drift check also looks at asleep instances' resources (not their runtime, which is stopped on purpose):
# drift found there is repaired by a recovery, which wakes the instance, instead of at the next customer's wake.
_DRIFT_CHECKED_INSTANCE = (*_SWEEPABLE_INSTANCE, InstanceStatus.ASLEEP)

# How a recovery that did not bring the runtime back is audited (the success is in recovery_steps).
_OUTCOME_ACTIONS = {RecoveryOutcome.FAILED: AuditAction.INSTANCE_RECOVERY_FAILED,
                    RecoveryOutcome.QUARANTINED: AuditAction.INSTANCE_RECOVERY_QUARANTINED}


@dataclass
class SweepResult:
    ran: bool
    dispatched: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _process_present(instance: AgentInstance) -> bool:
    """Is anything of the instance still running? Cheap where the driver can tell (no health probe)."""
    resources = list(instance.tenant.resources.all())  # prefetched by the caller
    runtime = next((r for r in resources if r.kind == ResourceKind.RUNTIME), None)
    if runtime is None:
        return False
    driver = runtime_driver()
    spec = tenant_spec(instance.tenant, resources=resources)
    if Capability.PRESENT in driver.capabilities:
        return bool(driver.present(spec))
    return driver.observe(spec, Ref(runtime.external_id, runtime.details)).exists


def recovery_candidates(*, now: float | None = None) -> list[tuple[AgentInstance, str, str]]:
    """Detection only: (instance, reason, detail) for every instance that needs a recovery now."""
    now = time.time() if now is None else now
    store = heartbeat_store()
    silent = set(store.silent_since(now - settings.HEARTBEAT_TIMEOUT_S))
    stalled = set(store.stalled_since(now - settings.PROGRESS_STALL_TIMEOUT_S)) - silent
    if not silent and not stalled:
        return []
    candidates = (
        AgentInstance.objects.select_related("tenant", "tenant__operator").prefetch_related("tenant__resources")
        .filter(pk__in=list(silent | stalled), status__in=_SWEEPABLE_INSTANCE, tenant__status__in=_SWEEPABLE_TENANT)
        .filter(Q(next_recovery_at__isnull=True) | Q(next_recovery_at__lte=timezone.now()))
        .exclude(recoveries__outcome__in=_ACTIVE)
    )
    found: list[tuple[AgentInstance, str, str]] = []
    for instance in candidates:
        if str(instance.pk) in stalled:
            found.append((instance, RecoveryReason.HUNG, "progress marker has not moved within the step timeout"))
        elif _process_present(instance):
            found.append((instance, RecoveryReason.HUNG, "no heartbeat, but the process is still there"))
        else:
            found.append((instance, *dead_reason(instance, "no heartbeat and the process is gone")))
    return found


def dead_reason(instance: AgentInstance, detail: str) -> tuple[str, str]:
    """(reason, detail) for an instance found gone: ``oom`` when the kernel killed it for its plan's memory (local
    instances in their cgroup), so the dashboard and the recovery say why; else ``dead``."""
    from provisioning.drivers.local_process import LocalProcessDriver, oom_killed
    from provisioning.resources.spec import tenant_spec

    runtime = instance.tenant.resources.filter(kind=ResourceKind.RUNTIME).first()
    if runtime is not None and runtime.driver == LocalProcessDriver.name and oom_killed(tenant_spec(instance.tenant)):
        return RecoveryReason.OOM, f"{detail}: killed by the kernel at its plan's memory limit"
    return RecoveryReason.DEAD, detail


def recovery_sweep(*, now: float | None = None) -> SweepResult:
    """One pass (a singleton): detect, then dispatch at most one recovery per instance."""
    started = time.perf_counter()
    with AdvisoryLock("recovery-sweep") as lock:
        if not lock.held:
            return SweepResult(ran=False)
        result = SweepResult(ran=True)
        for instance, reason, detail in recovery_candidates(now=now):
            recovery_start(instance=instance, reason=reason, detail=detail, actor=SYSTEM)
            result.dispatched.append(str(instance.pk))
        result.seconds = time.perf_counter() - started
        return result


def drift_check(*, limit: int = 500) -> list[str]:
    """Observe every resource of running (and asleep) instances; a missing or changed one triggers a drift
    recovery. An asleep instance's runtime is not observed (it is stopped on purpose); its other resources are.

    A rolling window: each run takes the ``limit`` instances checked longest ago (never checked first) and
    stamps them, so with N instances every one is observed within ceil(N / limit) runs."""
    dispatched: list[str] = []
    instances = list(AgentInstance.objects.select_related("tenant", "tenant__operator")
                     .filter(status__in=_DRIFT_CHECKED_INSTANCE, tenant__status__in=_SWEEPABLE_TENANT)
                     .exclude(recoveries__outcome__in=_ACTIVE)
                     .order_by(F("drift_checked_at").asc(nulls_first=True), "pk")[:limit])
    # Stamped before observing: a run that dies halfway moves on next time instead of retrying the same head.
    AgentInstance.objects.filter(pk__in=[i.pk for i in instances]).update(drift_checked_at=timezone.now())
    for instance in instances:
        spec = tenant_spec(instance.tenant)
        problems: list[str] = []
        unhealthy_runtime = False
        for resource in ProvisionedResource.objects.filter(tenant=instance.tenant):
            row = resource_kind(resource.kind)
            if not row.has_driver or (row.process and instance.status == InstanceStatus.ASLEEP):
                continue
            observed = driver_for(resource.kind).observe(spec, Ref(resource.external_id, resource.details))
            if row.process:
                unhealthy_runtime = observed.exists and not observed.healthy
                continue  # a dead process is the heartbeat sweep's business
            if not observed.healthy:
                problems.append(f"{resource.kind}: {observed.detail}")
        if problems:
            recovery_start(instance=instance, reason=RecoveryReason.DRIFT, detail="; ".join(problems), actor=SYSTEM)
            dispatched.append(str(instance.pk))
        elif unhealthy_runtime:
            recovery_start(instance=instance, reason=RecoveryReason.UNHEALTHY, detail="/healthz is failing",
                           actor=SYSTEM)
            dispatched.append(str(instance.pk))
    return dispatched


def recovery_start(*, instance: AgentInstance, reason: str, detail: str, actor: Actor) -> RecoveryEvent:
    with transaction.atomic():
        locked = AgentInstance.objects.select_for_update().get(pk=instance.pk)
        if RecoveryEvent.objects.filter(instance=locked, outcome__in=_ACTIVE).exists():
            raise Conflict("a recovery of this instance is already in progress")
        tenant = locked.tenant
        if tenant.status != TenantStatus.RECOVERING:
            tenant_transition(tenant=tenant, to=TenantStatus.RECOVERING, actor=actor, reason=f"{reason}: {detail}")
        run = workflow_start(tenant=tenant, kind=WorkflowKind.RECOVER, actor=actor)
        event = RecoveryEvent.objects.create(tenant=tenant, instance=locked, run=run, reason=reason, detail=detail,
                                             detected_at=timezone.now())
        locked.status = InstanceStatus.RECOVERING
        locked.status_reason = f"{reason}: {detail}"
        locked.save(update_fields=["status", "status_reason", "updated_at"])
        runtime_resource_mark(tenant, ResourceStatus.RECOVERING)  # committed with the event: never "ready" meanwhile
        audit_record(actor=actor, action=AuditAction.INSTANCE_RECOVERY_START, target=event, tenant=tenant,
                     data={"reason": reason, "detail": detail})
    return event


def recovery_failed(*, run: WorkflowRun, error: str, unrecoverable: bool = False) -> None:
    """Back off, or quarantine after too many failures in the window. Called by the engine."""
    event = RecoveryEvent.objects.select_related("instance", "tenant").filter(run=run).first()
    if event is None:
        return
    now = timezone.now()
    window_start = now - timedelta(seconds=settings.RECOVERY_FAILURE_WINDOW_S)
    failures = RecoveryEvent.objects.filter(
        instance=event.instance, detected_at__gte=window_start,
        outcome__in=(RecoveryOutcome.FAILED, RecoveryOutcome.QUARANTINED)).count() + 1
    tenant = event.tenant
    tenant.refresh_from_db()
    with transaction.atomic():
        if unrecoverable:
            outcome, inst_status = RecoveryOutcome.FAILED, InstanceStatus.FAILED
            tenant_transition(tenant=tenant, to=TenantStatus.FAILED, actor=SYSTEM, reason=error)
            next_at = None
        elif failures >= settings.RECOVERY_MAX_FAILURES:
            outcome, inst_status = RecoveryOutcome.QUARANTINED, InstanceStatus.QUARANTINED
            tenant_transition(tenant=tenant, to=TenantStatus.DEGRADED, actor=SYSTEM,
                              reason=f"quarantined after {failures} failed recoveries: {error}")
            next_at = None
        else:
            outcome, inst_status = RecoveryOutcome.FAILED, InstanceStatus.FAILED
            tenant_transition(tenant=tenant, to=TenantStatus.DEGRADED, actor=SYSTEM, reason=error)
            next_at = now + timedelta(seconds=settings.RECOVERY_BACKOFF_BASE_S * 2 ** (failures - 1))
        RecoveryEvent.objects.filter(pk=event.pk).update(outcome=outcome, finished_at=now, detail=(
            f"{event.detail}; failed: {error}")[:4000])
        AgentInstance.objects.filter(pk=event.instance_id).update(
            status=inst_status, status_reason=error[:2000], next_recovery_at=next_at)
        # Quarantined or backing off, the runtime did not come back: "failed" until a later recovery succeeds.
        runtime_resource_mark(tenant, ResourceStatus.FAILED)
        audit_record(actor=SYSTEM, action=_OUTCOME_ACTIONS[outcome], target=event, tenant=tenant,
                     data={"failures_in_window": failures})


def recovery_retry(*, instance: AgentInstance, actor: Actor) -> RecoveryEvent:
    """Staff's one-click retry: lift a quarantine (or backoff) and recover now."""
    with transaction.atomic():
        AgentInstance.objects.filter(pk=instance.pk).update(next_recovery_at=None)
        instance.refresh_from_db()
        if instance.tenant.status == TenantStatus.FAILED:
            raise Conflict("the tenant has failed; fix the cause and retry its workflow instead")
        return recovery_start(instance=instance, reason=RecoveryReason.MANUAL,
                              detail=f"retry requested by {actor.label}", actor=actor)
