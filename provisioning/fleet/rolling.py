"""Planned rolling restarts: drain (SIGTERM, wait for the clean-shutdown record), restart (the runtime
migrates its schema on boot), verify it booted, and only then move on; at most ``concurrency`` down
at once. Progress is committed per instance, so a killed worker resumes where it was.

A rolling restart is a kind of the job kernel (``controlplane.jobs``, kind ``rolling-restart``): the kernel holds
the lease (one driver per rollout), marks it running, and resumes it from the one stall sweep after
``WORKFLOW_STALL_AFTER_S`` (the sweep of workflow runs did before). The waves (``concurrency`` instances each,
the stop after a wave with a failed instance, the heartbeat after each) are the kernel's one wave rollout
(``controlplane.jobs.waves``). What is left here is the restart itself.
"""

from __future__ import annotations

import time
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.errors import ProvisioningError
from controlplane.jobs import (
    JobKind,
    WaveEnd,
    WaveFleet,
    WavePlan,
    job_drive,
    job_kind_register,
    job_start,
    waves_drive,
)
from provisioning.choices import InstanceStatus, StepStatus, WorkflowStatus
from provisioning.drivers.pg_admin import tenant_admin_connect
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import runtime_driver
from provisioning.fleet.instances import instance_start
from provisioning.models import AgentInstance, RollingRestart, RollingRestartItem
from provisioning.resources import runtime_tables
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["ROLLING_RESTART_JOBS", "rolling_restart_start", "rolling_restart_execute"]


def rolling_restart_start(*, actor: Actor, concurrency: int | None = None, reason: str = "") -> RollingRestart:
    with transaction.atomic():
        rollout = RollingRestart.objects.create(
            concurrency=max(1, concurrency or settings.ROLLING_RESTART_CONCURRENCY), reason=reason)
        instances = AgentInstance.objects.filter(status=InstanceStatus.RUNNING, tenant__status=TenantStatus.READY)
        RollingRestartItem.objects.bulk_create(
            [RollingRestartItem(rollout=rollout, instance=i) for i in instances.order_by("created_at")])
        audit_record(actor=actor, action=AuditAction.ROLLING_RESTART_START, target=rollout,
                     data={"instances": instances.count(), "concurrency": rollout.concurrency})
        job_start(ROLLING_RESTART_JOBS, rollout.pk)
    return rollout


def _latest_event_at(tenant: Tenant, kind: str) -> datetime | None:
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        return runtime_tables.last_event_at(conn, tenant.resource_name, kind)


class _RestartWaves(WaveFleet[int]):
    """The rollout's items as the wave driver's fleet: waves of ``concurrency`` instances in item order (planned by
    position, so a resume finds the same waves), no gate beyond each instance's own boot check, and the first
    failed instance stops the rollout after its wave."""

    def __init__(self, rollout: RollingRestart) -> None:
        self.job_kind, self.job_id = ROLLING_RESTART_JOBS, str(rollout.pk)
        self.concurrency = rollout.concurrency
        self.plan = WavePlan(size=rollout.concurrency)
        self.items = RollingRestartItem.objects.filter(rollout=rollout).order_by("id")

    def next_wave(self) -> int | None:
        first = self.items.exclude(status=StepStatus.DONE).values_list("pk", flat=True).first()
        return None if first is None else self.plan.wave_of(self.items.filter(pk__lt=first).count())

    def remaining(self, wave: int, limit: int) -> list[int]:
        span = self.plan.positions(wave)
        in_wave = list(self.items.values_list("pk", flat=True)[span.start:span.stop])
        # Items left "running" by a killed worker are redone: stop and start are idempotent.
        return list(self.items.filter(pk__in=in_wave, status__in=(StepStatus.PENDING, StepStatus.RUNNING))
                    .values_list("pk", flat=True)[:limit])

    def apply(self, target: int) -> None:
        _restart_one(target)

    def record_failure(self, target: int, error: Exception) -> None:
        RollingRestartItem.objects.filter(pk=target).update(status=StepStatus.FAILED, error=str(error)[:2000])

    def wave_failure(self, wave: int) -> str:
        failed = self.items.filter(status=StepStatus.FAILED).first()
        return f"the restart of {failed.instance_id} failed: {failed.error}" if failed is not None else ""


def _restart_one(item_id: int) -> None:
    """Drain, restart and verify one instance (an exception is recorded by ``_RestartWaves.record_failure``)."""
    item = RollingRestartItem.objects.select_related("instance__tenant__operator").get(pk=item_id)
    tenant = item.instance.tenant
    RollingRestartItem.objects.filter(pk=item_id).update(status=StepStatus.RUNNING)
    began = timezone.now()
    # Planned downtime: out of the recovery sweep's reach until instance_start marks it running.
    AgentInstance.objects.filter(pk=item.instance_id).update(status=InstanceStatus.STOPPED)
    driver = runtime_driver()
    if Capability.STOP in driver.capabilities:
        driver.stop(tenant_spec(tenant), grace_s=settings.RUNTIME_STOP_GRACE_S)
    shutdown_at = _latest_event_at(tenant, "clean_shutdown")
    clean = bool(shutdown_at and shutdown_at >= began)
    RollingRestartItem.objects.filter(pk=item_id).update(stopped_at=timezone.now(), clean_shutdown=clean)
    instance_start(tenant=tenant, actor=SYSTEM)
    deadline = time.monotonic() + settings.RECOVERY_VERIFY_TIMEOUT_S
    while not ((_latest_event_at(tenant, "boot") or began) > began):
        if time.monotonic() > deadline:
            raise ProvisioningError("the instance did not record a boot after its restart")
        time.sleep(0.2)
    RollingRestartItem.objects.filter(pk=item_id).update(status=StepStatus.DONE, started_at=timezone.now())


def rolling_restart_execute(rollout_id: int) -> str:
    """Run (or resume) a rollout. Stops at the first failed instance, leaving the rest untouched."""
    return job_drive(ROLLING_RESTART_JOBS, rollout_id)


def _execute(rollout_id: str) -> str:
    """The kind's body: the kernel holds the lease and has marked the rollout running."""
    result = waves_drive(_RestartWaves(RollingRestart.objects.get(pk=rollout_id)))
    status = WorkflowStatus.FAILED if result.end == WaveEnd.FAILED else WorkflowStatus.SUCCEEDED
    RollingRestart.objects.filter(pk=rollout_id).update(status=status, finished_at=timezone.now())
    return status


ROLLING_RESTART_JOBS = job_kind_register(JobKind(
    name="rolling-restart", model=RollingRestart, active_statuses=(WorkflowStatus.PENDING, WorkflowStatus.RUNNING),
    run=_execute, running_status=WorkflowStatus.RUNNING, marks_started=False, stall_after_s="WORKFLOW_STALL_AFTER_S",
))
