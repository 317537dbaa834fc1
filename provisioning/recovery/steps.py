"""The recovery workflow: stop what is left, repair drift, start, verify the instance read back and resumed.

Each step is idempotent like the onboarding steps it reuses. The verify step reads the
runtime's own record of the restart (the ``host_events`` boot row, ``checkpoints`` and
``step_events`` tables in the tenant's schema, read-only with the admin connection, through
``provisioning.resources.runtime_tables``).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.errors import ProvisioningError
from provisioning.choices import InstanceStatus, RecoveryOutcome, RecoveryReason, ResourceKind, ResourceStatus
from provisioning.databases.archives import schema_restore_latest
from provisioning.drivers.base import Ref
from provisioning.drivers.pg_admin import tenant_admin_connect, tenant_pooled
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import driver_for, runtime_driver
from provisioning.models import AgentInstance, ProvisionedResource, RecoveryEvent
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.resources import runtime_tables
from provisioning.resources.kinds import repairable_kinds
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.steps import StepContext, StepFn, _record, runtime_resource_mark, step_runtime
from tenants.actors import SYSTEM
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant

__all__ = ["STEPS", "Unrecoverable"]

log = logging.getLogger(__name__)


class Unrecoverable(ProvisioningError):
    """Repair is impossible without losing history (e.g. a dropped schema with no archive): no retries."""

    title = "Unrecoverable"
    type_slug = "unrecoverable"


def _event(ctx: StepContext) -> RecoveryEvent:
    assert ctx.run is not None
    return RecoveryEvent.objects.get(run=ctx.run)


def step_stop(ctx: StepContext) -> dict[str, Any]:
    event = _event(ctx)
    RecoveryEvent.objects.filter(pk=event.pk).update(outcome=RecoveryOutcome.RUNNING)
    driver = runtime_driver()
    spec = tenant_spec(ctx.tenant)
    resource = ProvisionedResource.objects.filter(tenant=ctx.tenant, kind=ResourceKind.RUNTIME).first()
    clean: bool | None = None
    grace = settings.RECOVERY_STOP_GRACE_S
    if event.reason == RecoveryReason.HUNG:
        grace = min(grace, settings.RECOVERY_HUNG_STOP_GRACE_S)
    if Capability.STOP in driver.capabilities:
        clean = driver.stop(spec, grace_s=grace)
    elif resource is not None:
        driver.delete(spec, Ref(resource.external_id, resource.details))
    lease_ended = tenant_pooled(spec.database_server) and _end_stopped_hosts_lease(ctx.tenant)
    RecoveryEvent.objects.filter(pk=event.pk).update(stopped_at=timezone.now())
    return {"clean_exit": clean, "lease_ended": lease_ended}


def _end_stopped_hosts_lease(tenant: Tenant) -> bool:
    """Pooled instances only: end the lease of the host just stopped, so its successor takes over at once.

    Through a transaction pooler the lease row is the single-writer lock (no session lock to steal): a host that
    was killed leaves it live for up to ``AGENT_LEASE_TTL_S`` (15 s), and the new host would wait that long. The
    stop has just ended the process (the local driver's stop returns once it is gone; the Kubernetes one once
    its pod is gone), so nothing renews it. Only the expiry moves: were the old host alive after all, the
    fence would still refuse its writes from the takeover on, as after any takeover. A direct host steals the
    lease with its session lock and needs none of this. Best effort: on any error the successor waits the TTL.
    """
    try:
        with tenant_admin_connect(tenant, autocommit=True) as conn:
            # False when never booted (or the schema is lost: the repair step's business).
            return runtime_tables.lease_expire_now(conn, tenant.resource_name)
    except psycopg.Error as exc:
        log.warning("the stopped host's lease was not ended", extra={
            "event": "recovery_lease_end_failed", "tenant_id": str(tenant.pk), "error": type(exc).__name__})
        return False


def step_repair(ctx: StepContext) -> dict[str, Any]:
    """Repair drift through the same ensure steps as onboarding; a lost schema comes back from its archive."""
    event = _event(ctx)
    repaired: list[str] = []
    for row in repairable_kinds():
        kind, secrets = row.kind, row.ensure_secrets
        resource = ProvisionedResource.objects.filter(tenant=ctx.tenant, kind=kind).first()
        if resource is None:
            continue
        driver = driver_for(kind)
        observed = driver.observe(tenant_spec(ctx.tenant), Ref(resource.external_id, resource.details))
        if observed.healthy:
            continue
        schema_lost = kind == ResourceKind.DATABASE and not _schema_exists(ctx.tenant)
        ref = driver.ensure(tenant_spec(ctx.tenant, with_secrets=secrets))
        if schema_lost:
            try:
                schema_restore_latest(tenant=ctx.tenant)
            except ProvisioningError as exc:
                driver.delete(tenant_spec(ctx.tenant), ref)  # never leave an empty schema posing as the real one
                raise Unrecoverable(f"database drift: {exc.detail}") from None
        _record(ctx.tenant, kind, driver.name, ref)
        repaired.append(f"{kind}: {observed.detail}" + (" (restored from archive)" if schema_lost else ""))
    RecoveryEvent.objects.filter(pk=event.pk).update(repaired=repaired)
    return {"repaired": repaired}


def _schema_exists(tenant: Tenant) -> bool:
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (tenant.resource_name,)).fetchone() is not None


def step_start(ctx: StepContext) -> dict[str, Any]:
    # Started is not resumed: the record says "recovering" until step_verify saw the boot and the resume.
    return step_runtime(ctx, status=ResourceStatus.RECOVERING)


def _boot_after(tenant: Tenant, after: datetime) -> tuple[datetime, datetime | None] | None:
    """(this boot, previous boot) from the runtime's host_events, if it booted after ``after``."""
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        boots = runtime_tables.latest_boots(conn, tenant.resource_name, limit=2)
    if not boots or boots[0] <= after:
        return None
    return boots[0], (boots[1] if len(boots) > 1 else None)


def step_verify(ctx: StepContext) -> dict[str, Any]:
    """Wait for the runtime's boot record, then measure what it resumed from and what was lost."""
    event = _event(ctx)
    schema = ctx.tenant.resource_name
    deadline = time.monotonic() + settings.RECOVERY_VERIFY_TIMEOUT_S
    boots = None
    while boots is None:
        boots = _boot_after(ctx.tenant, event.detected_at)
        if boots is None:
            if time.monotonic() > deadline:
                raise ProvisioningError("the instance did not record a boot after the recovery")
            time.sleep(0.2)
    boot_at, previous_boot = boots
    with tenant_admin_connect(ctx.tenant, autocommit=True) as conn:
        checkpoint = runtime_tables.checkpoint_before(conn, schema, boot_at)
        # Steps in flight at the crash: started since the previous boot and never finished before this one.
        lost = runtime_tables.steps_in_flight(conn, schema, boot_at=boot_at, previous_boot=previous_boot)
        resumed = runtime_tables.first_step_start_since(conn, schema, boot_at)
    from_checkpoint = f"{checkpoint.id} ({checkpoint.step})" if checkpoint else ""
    now = timezone.now()
    with transaction.atomic():
        RecoveryEvent.objects.filter(pk=event.pk).update(
            outcome=RecoveryOutcome.SUCCEEDED, resumed_at=resumed or boot_at, from_checkpoint=from_checkpoint,
            steps_lost=lost, finished_at=now,
        )
        # Failures are audited in recovery.recovery_failed; the success is a state change too (and an event).
        audit_record(actor=SYSTEM, action=AuditAction.INSTANCE_RECOVERY_SUCCEEDED, target=event,
                     tenant=ctx.tenant, data={"steps_lost": lost})
    AgentInstance.objects.filter(tenant=ctx.tenant).update(
        status=InstanceStatus.RUNNING, status_reason="", next_recovery_at=None)
    runtime_resource_mark(ctx.tenant, ResourceStatus.READY)
    heartbeat_store().record(str(event.instance_id), {"status": "starting", "progress_seq": -1})
    tenant_transition(tenant=ctx.tenant, to=TenantStatus.READY, actor=ctx.actor, reason="")
    return {"from_checkpoint": from_checkpoint, "steps_lost": lost}


STEPS: list[tuple[str, StepFn]] = [
    ("stop", step_stop), ("repair", step_repair), ("start", step_start), ("verify", step_verify),
]
