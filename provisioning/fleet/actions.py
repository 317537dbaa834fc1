"""What an operator or staff member does to a customer's instance: suspend, resume, restart, stop on purpose.

One implementation behind the API, the portal, the dashboard and ``manage.py local_instances``, so each
records the same thing: a planned stop is marked ``stopped`` (the recovery sweep only looks at running
instances) *before* its process is signalled, and its last heartbeat is forgotten once it is down, so it
never shows up as a "dead" recovery. Stopping waits for a step boundary (up to ``RUNTIME_STOP_GRACE_S``),
which is far too long for a web request: requests commit the decision and queue the work to a Celery worker
(``transaction.on_commit``), and the page or API client follows the instance's status.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from controlplane.errors import InvalidTransition
from provisioning.choices import InstanceStatus
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import runtime_driver
from provisioning.fleet.instances import instance_start
from provisioning.models import AgentInstance
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.resources.spec import tenant_spec
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant

__all__ = ["instance_stop_planned", "instance_restart", "instance_restart_request", "tenant_suspend",
           "tenant_resume", "actor_to_dict", "actor_from_dict", "RESTARTABLE", "SUSPENDABLE"]

# A restart needs a tenant whose instance is meant to run; a suspend, one that is not already on its way out.
RESTARTABLE = (TenantStatus.READY, TenantStatus.DEGRADED)
SUSPENDABLE = (TenantStatus.READY, TenantStatus.DEGRADED, TenantStatus.SUSPENDED)


def actor_to_dict(actor: Actor) -> dict[str, Any]:
    """The acting identity as a Celery argument (JSON), so the worker's audit rows name the real actor."""
    return {"kind": actor.kind, "id": actor.id, "label": actor.label, "operator_id": actor.operator_id}


def actor_from_dict(data: dict[str, Any]) -> Actor:
    return Actor(kind=str(data["kind"]), id=str(data.get("id", "")), label=str(data.get("label", "")),
                 operator_id=data.get("operator_id"))


def instance_stop_planned(*, tenant: Tenant, actor: Actor, reason: str) -> None:
    """Stop the instance on purpose (graceful where the driver can) and record it as planned, not a failure."""
    AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.STOPPED, status_reason=reason[:2000])
    driver = runtime_driver()
    if Capability.STOP in driver.capabilities:
        driver.stop(tenant_spec(tenant), grace_s=settings.RUNTIME_STOP_GRACE_S)
    # After the stop: a host sends a last heartbeat as it shuts down, which would otherwise look stale later.
    instance = AgentInstance.objects.filter(tenant=tenant).first()
    if instance is not None:
        heartbeat_store().forget(str(instance.pk))
    audit_record(actor=actor, action=AuditAction.INSTANCE_STOP, tenant=tenant,
                 data={"planned": True, "reason": reason, "driver": driver.name})


def instance_restart(*, tenant: Tenant, actor: Actor) -> dict[str, Any]:
    """Stop the instance gracefully and ensure it runs again (in a worker: it can take the stop grace)."""
    instance_stop_planned(tenant=tenant, actor=actor, reason=f"restarting (by {actor.label})")
    audit_record(actor=actor, action=AuditAction.INSTANCE_RESTART, tenant=tenant, data={})
    try:
        return instance_start(tenant=tenant, actor=actor)
    except Exception as exc:
        # Did not come back: failed, so the recovery sweep takes it from here (with its backoff and quarantine).
        AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.FAILED,
                                                           status_reason=f"restart failed: {exc}"[:2000])
        raise


def _queue(task_name: str, tenant: Tenant, actor: Actor) -> None:
    from provisioning import tasks

    task = getattr(tasks, task_name)
    args = (str(tenant.pk), actor_to_dict(actor))
    transaction.on_commit(lambda: task.delay(*args))


def instance_restart_request(*, tenant: Tenant, actor: Actor) -> Tenant:
    """Queue a restart (a worker stops and starts the instance); 409 unless the tenant is meant to be running."""
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status not in RESTARTABLE:
            raise InvalidTransition(f"a {locked.status} tenant cannot be restarted")
        audit_record(actor=actor, action=AuditAction.INSTANCE_RESTART_REQUESTED, tenant=locked, data={})
        _queue("instance_restart_task", locked, actor)
    return locked


def tenant_suspend(*, tenant: Tenant, actor: Actor, reason: str = "") -> Tenant:
    """Suspend: the instance is stopped (in a worker), data and resources are kept; messages wait in the inbox."""
    reason = reason.strip() or f"suspended by {actor.label}"
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status not in SUSPENDABLE:
            raise InvalidTransition(f"a {locked.status} tenant cannot be suspended")
        already = locked.status == TenantStatus.SUSPENDED
        tenant_transition(tenant=locked, to=TenantStatus.SUSPENDED, actor=actor, reason=reason)
        if not already:
            # Marked at once so neither the recovery sweep nor `local_instances start` revives it meanwhile.
            AgentInstance.objects.filter(tenant=locked).update(status=InstanceStatus.STOPPED,
                                                               status_reason="stopping: tenant suspended")
            _queue("instance_stop_task", locked, actor)
    tenant.status, tenant.status_reason = locked.status, locked.status_reason
    return tenant


def tenant_resume(*, tenant: Tenant, actor: Actor) -> Tenant:
    """Resume a suspended tenant: ready again, and a worker starts its instance (it reads back its state first)."""
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status == TenantStatus.READY:
            return locked
        if locked.status != TenantStatus.SUSPENDED:
            raise InvalidTransition(f"a {locked.status} tenant cannot be resumed (only a suspended one)")
        tenant_transition(tenant=locked, to=TenantStatus.READY, actor=actor, reason="")
        AgentInstance.objects.filter(tenant=locked).update(status=InstanceStatus.STARTING,
                                                           status_reason="starting: tenant resumed")
        _queue("instance_start_task", locked, actor)
    tenant.status, tenant.status_reason = locked.status, locked.status_reason
    return tenant
