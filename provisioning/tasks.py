"""Celery tasks for provisioning: ids in, one service call, retry policy here."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from provisioning.choices import InstanceStatus
from provisioning.databases.archive_expiry import archives_expire_and_shred
from provisioning.databases.backups import schema_backups_run
from provisioning.fleet.actions import RESTARTABLE, actor_from_dict, instance_restart, instance_stop_planned
from provisioning.fleet.instances import instance_start
from provisioning.fleet.sleep import instance_wake, sleep_sweep
from provisioning.models import AgentInstance
from provisioning.recovery.heartbeats import heartbeats_sync
from provisioning.recovery.sweep import drift_check, recovery_sweep
from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["recovery_sweep_task", "drift_check_task",
           "heartbeats_sync_task", "schema_backups_task",
           "instance_restart_task", "instance_stop_task", "instance_start_task", "instance_sleep_sweep_task",
           "instance_wake_task", "archives_expire_and_shred_task"]


@shared_task(acks_late=True)
def recovery_sweep_task() -> int:
    return len(recovery_sweep().dispatched)


@shared_task(acks_late=True)
def drift_check_task() -> int:
    return len(drift_check())


@shared_task(acks_late=True)
def heartbeats_sync_task() -> int:
    return heartbeats_sync()


@shared_task(acks_late=True)
def schema_backups_task() -> int:
    return schema_backups_run()


# Registered under its first name (it lived in vault.tasks): beat's rows, controlplane/periodic.py and any message
# already queued name it so.
@shared_task(name="vault.tasks.archives_expire_and_shred_task", acks_late=True)
def archives_expire_and_shred_task() -> dict[str, Any]:
    """Delete expired archives, then destroy retired data keys nothing needs (a singleton; safe to re-run)."""
    return archives_expire_and_shred()


def _tenant_and_actor(tenant_id: str, actor: dict[str, Any]) -> tuple[Tenant, Any]:
    return Tenant.objects.select_related("operator").get(pk=tenant_id), actor_from_dict(actor)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def instance_restart_task(tenant_id: str, actor: dict[str, Any]) -> str:
    """A restart asked for by a person (dashboard, portal, API): stop at a step boundary, start again."""
    tenant, who = _tenant_and_actor(tenant_id, actor)
    if tenant.status not in RESTARTABLE:  # suspended or deprovisioned since it was asked: nothing to do
        return f"skipped: tenant is {tenant.status}"
    instance_restart(tenant=tenant, actor=who)
    return str(TenantStatus.READY)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def instance_stop_task(tenant_id: str, actor: dict[str, Any]) -> str:
    """The stop of a suspended tenant's instance (idempotent: stopping a stopped instance is a no-op)."""
    tenant, who = _tenant_and_actor(tenant_id, actor)
    if tenant.status != TenantStatus.SUSPENDED:  # resumed before the worker got here
        return f"skipped: tenant is {tenant.status}"
    instance_stop_planned(tenant=tenant, actor=who, reason="suspended")
    return "stopped"


@shared_task(acks_late=True, reject_on_worker_lost=True)
def instance_start_task(tenant_id: str, actor: dict[str, Any]) -> str:
    """The start of a resumed tenant's instance; a failure leaves it `failed` for the recovery sweep."""
    tenant, who = _tenant_and_actor(tenant_id, actor)
    if tenant.status not in RESTARTABLE:
        return f"skipped: tenant is {tenant.status}"
    try:
        instance_start(tenant=tenant, actor=who)
    except Exception as exc:
        AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.FAILED,
                                                           status_reason=f"start failed: {exc}"[:2000])
        raise
    return "started"


@shared_task(acks_late=True)
def instance_sleep_sweep_task() -> int:
    """Beat: idle instances to sleep, asleep ones with items waiting woken (provisioning/fleet/sleep.py)."""
    return len(sleep_sweep().asleep)


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=20)
def instance_wake_task(self: Task, wake_id: int) -> str:
    """Wake an asleep instance and deliver what waits; retried while a stop still holds its lifecycle lock."""
    try:
        return instance_wake(wake_id=wake_id)
    except TimeoutError:
        raise self.retry(countdown=1) from None
