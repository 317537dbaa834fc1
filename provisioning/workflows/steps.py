"""The steps of the onboarding and deprovisioning workflows.

Each step is an idempotent ``ensure`` (or ``delete``) through a driver, followed by an
upsert of the committed ``ProvisionedResource`` record. A step may run again after a
crash at any point, so nothing here assumes it runs once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from controlplane.errors import ProvisioningError, VaultError
from provisioning.choices import InstanceStatus, ResourceKind, ResourceStatus
from provisioning.databases.archives import schema_archive
from provisioning.databases.servers import database_server_record_auth
from provisioning.drivers.base import Ref
from provisioning.drivers.registry import driver_for
from provisioning.models import AgentInstance, ProvisionedResource, WorkflowRun
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.resources import contributions
from provisioning.resources.kinds import DELETE_ORDER, RESOURCE_KINDS, resource_kind, runtime_secrets
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant
from vault.choices import KeyPurpose, KeyStatus
from vault.models import TenantDataKey
from vault.services import tenant_data_key_ensure

__all__ = ["StepContext", "ONBOARD_STEPS", "DEPROVISION_STEPS", "runtime_resource_mark", "runtime_resource_started"]


@dataclass
class StepContext:
    tenant: Tenant
    run: WorkflowRun | None = None
    actor: Actor = SYSTEM


_UPSERT_RESOURCE = f"""
    INSERT INTO {ProvisionedResource._meta.db_table}
        (tenant_id, kind, driver, external_id, details, status, created_at, updated_at)
    VALUES (%s, %s, %s, %s, %s, %s, now(), now())
    ON CONFLICT (tenant_id, kind) DO UPDATE SET driver = EXCLUDED.driver, external_id = EXCLUDED.external_id,
        details = EXCLUDED.details, status = EXCLUDED.status, updated_at = EXCLUDED.updated_at
    RETURNING id, (xmax = 0) AS inserted
"""  # noqa: S608 - the table name is our own model's


def _record(tenant: Tenant, kind: str, driver: str, ref: Ref, status: str = ResourceStatus.READY) -> dict[str, Any]:
    """Upsert the committed record of a resource in one statement; the first record is audited with it."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_UPSERT_RESOURCE, [tenant.pk, kind, driver, ref.external_id, json.dumps(dict(ref.details)),
                                       status])
        resource_id, inserted = cur.fetchone()
        if inserted:
            audit_record(
                actor=SYSTEM, action=AuditAction.RESOURCE_PROVISION, target=ProvisionedResource(pk=resource_id),
                tenant=tenant,
                data={"kind": kind, "external_id": ref.external_id},
            )
    return {"external_id": ref.external_id}


def runtime_resource_mark(tenant: Tenant, status: str) -> int:
    """Set the runtime record's status (recovery: ``recovering``, then ``ready`` or ``failed``).

    A deleted runtime stays deleted: a late recovery write never resurrects the record of a removed instance.
    """
    return (ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.RUNTIME)
            .exclude(status=ResourceStatus.DELETED).update(status=status, updated_at=timezone.now()))


def runtime_resource_started(tenant: Tenant, *, driver_name: str, ref: Ref) -> int:
    """The runtime record names what runs now: the external id and details of the driver's ``ensure`` that just
    (re)started the instance (a restart, a wake, a release switch, ``manage.py instance start``: each a new pid on
    the local profile). Its status is left to whoever owns it (a recovery's ``recovering``, a failed one's
    ``failed``), and a deleted record stays deleted. Onboarding and recovery write the whole record instead
    (``step_runtime``)."""
    return (ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.RUNTIME)
            .exclude(status=ResourceStatus.DELETED)
            .update(driver=driver_name, external_id=ref.external_id, details=dict(ref.details),
                    updated_at=timezone.now()))


def _ensure(ctx: StepContext, kind: str, *secrets: str) -> dict[str, Any]:
    driver = driver_for(kind)
    ref = driver.ensure(tenant_spec(ctx.tenant, with_secrets=secrets))
    return _record(ctx.tenant, kind, driver.name, ref)


StepFn = Callable[[StepContext], dict[str, Any]]


# --- onboarding ---------------------------------------------------------------------------------


def step_database(ctx: StepContext) -> dict[str, Any]:
    tenant_transition(tenant=ctx.tenant, to=TenantStatus.PROVISIONING, actor=ctx.actor)
    recorded = _ensure(ctx, ResourceKind.DATABASE, *resource_kind(ResourceKind.DATABASE).ensure_secrets)
    details = ProvisionedResource.objects.get(tenant=ctx.tenant, kind=ResourceKind.DATABASE).details
    database_server_record_auth(str(details.get("server", "")), str(details.get("auth", "")))
    return recorded


def _ensure_step(kind: ResourceKind) -> StepFn:
    """The onboarding step of a kind that needs nothing but its driver's ``ensure`` and its record."""
    def step(ctx: StepContext) -> dict[str, Any]:
        return _ensure(ctx, kind, *resource_kind(kind).ensure_secrets)

    step.__name__ = step.__qualname__ = f"step_{kind}"
    return step


step_volume = _ensure_step(ResourceKind.VOLUME)
step_objectstore = _ensure_step(ResourceKind.OBJECTSTORE)


def step_vault(ctx: StepContext) -> dict[str, Any]:
    credentials = tenant_data_key_ensure(tenant=ctx.tenant, purpose=KeyPurpose.CREDENTIALS)
    objects = tenant_data_key_ensure(tenant=ctx.tenant, purpose=KeyPurpose.OBJECTS)
    ref = Ref(
        external_id=f"credentials:v{credentials.version},objects:v{objects.version}",
        details={"kek_id": objects.kek_id},
    )
    return _record(ctx.tenant, ResourceKind.VAULT, "vault-envelope", ref)


def step_runtime(ctx: StepContext, *, status: str = ResourceStatus.READY) -> dict[str, Any]:
    """Start the instance; ``status`` is what its record says afterwards (a recovery keeps ``recovering``
    until its verify step saw the instance resume)."""
    contributions.runtime_starting(tenant=ctx.tenant)  # issue 14: new customers start on the default release
    spec = tenant_spec(ctx.tenant, with_secrets=runtime_secrets())
    driver = driver_for(ResourceKind.RUNTIME)
    ref = driver.ensure(spec)
    instance = AgentInstance.objects.only("pk").get(tenant=ctx.tenant)  # created with the tenant
    AgentInstance.objects.filter(pk=instance.pk).update(
        status=InstanceStatus.PENDING if ref.details.get("deferred") else InstanceStatus.RUNNING,
        driver=driver.name,
        endpoint=str(ref.details.get("endpoint", "")),
        token_hash=hashlib.sha256(spec.secrets["instance_token"].encode()).hexdigest(),
        updated_at=timezone.now(),
    )
    if not ref.details.get("deferred"):
        # Registered as just seen: an instance that dies before its first heartbeat is still noticed.
        heartbeat_store().record(str(instance.pk), {"status": "starting", "progress_seq": -1})
    out = _record(ctx.tenant, ResourceKind.RUNTIME, driver.name, ref, status=status)
    contributions.runtime_started(tenant=ctx.tenant, driver=driver)  # issue 7: branded from the start
    return out


def step_ready(ctx: StepContext) -> dict[str, Any]:
    tenant_transition(tenant=ctx.tenant, to=TenantStatus.READY, actor=ctx.actor)
    return {"status": TenantStatus.READY}


# --- deprovisioning -------------------------------------------------------------------------------


def _delete(ctx: StepContext, kind: str) -> dict[str, Any]:
    resource = ProvisionedResource.objects.filter(tenant=ctx.tenant, kind=kind).first()
    if resource is None or resource.status == ResourceStatus.DELETED:
        return {"skipped": True}
    driver = driver_for(kind)
    driver.delete(tenant_spec(ctx.tenant), Ref(resource.external_id, resource.details))
    resource.status = ResourceStatus.DELETED
    resource.save(update_fields=["status", "updated_at"])
    audit_record(actor=SYSTEM, action=AuditAction.RESOURCE_DELETE, target=resource, tenant=ctx.tenant,
                 data={"kind": kind})
    return {"deleted": resource.external_id}


def step_stop_runtime(ctx: StepContext) -> dict[str, Any]:
    out = _delete(ctx, ResourceKind.RUNTIME)
    AgentInstance.objects.filter(tenant=ctx.tenant).update(status=InstanceStatus.STOPPED)
    return out


def step_archive_database(ctx: StepContext) -> dict[str, Any]:
    """pg_dump the tenant schema, encrypted with the tenant's object key, stored outside its prefix."""
    resource = ProvisionedResource.objects.filter(tenant=ctx.tenant, kind=ResourceKind.DATABASE).first()
    if resource is None or resource.status == ResourceStatus.DELETED:
        return {"skipped": True}
    if resource.details.get("archive_label") == "final":
        return {"archive_url": resource.details["archive_url"]}  # archived (and read back) before a crash
    try:
        archive = schema_archive(tenant=ctx.tenant, label="final")
    except VaultError as exc:
        # The steps after this one delete the schema: without an archive that opens, nothing is deleted.
        raise ProvisioningError(
            f"deprovisioning stopped before deleting anything: the schema cannot be archived readably "
            f"because the vault failed ({exc.title}: {exc.detail})"
        ) from exc
    return {"archive_url": archive["archive_url"], "bytes": archive["archive_bytes"]}


def _delete_step(kind: ResourceKind) -> StepFn:
    """The deprovisioning step of a kind that needs nothing but its driver's ``delete`` and its record."""
    def step(ctx: StepContext) -> dict[str, Any]:
        return _delete(ctx, kind)

    step.__name__ = step.__qualname__ = f"step_{resource_kind(kind).delete_step}"
    return step


step_drop_database = _delete_step(ResourceKind.DATABASE)
step_delete_objectstore = _delete_step(ResourceKind.OBJECTSTORE)
step_delete_volume = _delete_step(ResourceKind.VOLUME)


def step_retire_vault(ctx: StepContext) -> dict[str, Any]:
    """End what features hold for the tenant (its connected accounts: revoked at the providers, their tokens
    deleted), then retire the tenant's keys. The object key is kept (retired) as long as its archive is retained."""
    ended = contributions.deprovision_hooks_run(tenant=ctx.tenant, actor=ctx.actor)
    now = timezone.now()
    retired = TenantDataKey.objects.filter(tenant=ctx.tenant, status=KeyStatus.ACTIVE).update(
        status=KeyStatus.RETIRED, retired_at=now
    )
    ProvisionedResource.objects.filter(tenant=ctx.tenant, kind=ResourceKind.VAULT).update(
        status=ResourceStatus.DELETED, updated_at=now
    )
    ctx.tenant.credentials.filter(revoked_at__isnull=True).update(revoked_at=now)
    return {"retired_keys": retired, **ended}


def step_deleted(ctx: StepContext) -> dict[str, Any]:
    tenant_transition(tenant=ctx.tenant, to=TenantStatus.DELETED, actor=ctx.actor)
    return {"status": TenantStatus.DELETED}


# Kinds whose steps do more than ensure (or delete) through their driver; every other row of the table gets the
# plain ones, so a new kind needs no code here. Step names come from the table: they are stored in workflow runs.
_ONBOARD_STEP: dict[ResourceKind, StepFn] = {
    ResourceKind.DATABASE: step_database, ResourceKind.VAULT: step_vault, ResourceKind.RUNTIME: step_runtime}
_DELETE_STEP: dict[ResourceKind, StepFn] = {
    ResourceKind.RUNTIME: step_stop_runtime, ResourceKind.VAULT: step_retire_vault}
# Archived (and read back) before anything is dropped: a schema that cannot be archived is never deleted.
_BEFORE_DELETE: dict[ResourceKind, list[tuple[str, StepFn]]] = {
    ResourceKind.DATABASE: [("archive_database", step_archive_database)]}

ONBOARD_STEPS: list[tuple[str, StepFn]] = [
    *((str(row.kind), _ONBOARD_STEP.get(row.kind) or _ensure_step(row.kind)) for row in RESOURCE_KINDS),
    ("ready", step_ready),
]
DEPROVISION_STEPS: list[tuple[str, StepFn]] = [
    *(step for kind in DELETE_ORDER for step in [
        *_BEFORE_DELETE.get(kind, []),
        (resource_kind(kind).delete_step, _DELETE_STEP.get(kind) or _delete_step(kind))]),
    ("deleted", step_deleted),
]
