"""Staff actions that are more than one call to an existing service. Everything else calls those directly."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from provisioning.choices import InstanceStatus, ResourceKind
from provisioning.drivers.registry import driver_for
from provisioning.heartbeats import heartbeat_store
from provisioning.instances import instance_start
from provisioning.models import AgentInstance
from provisioning.spec import tenant_spec
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant
from vault.choices import KeyPurpose
from vault.models import RotationJob
from vault.rotation import data_key_rotate_start

__all__ = ["instance_restart", "tenant_suspend", "tenant_resume", "tenant_keys_rotate"]


def instance_restart(*, tenant: Tenant, actor: Actor) -> dict[str, Any]:
    """Stop the instance gracefully (when its driver can) and ensure it runs again."""
    driver = driver_for(ResourceKind.RUNTIME)
    stop = getattr(driver, "stop", None)
    # A planned restart is not a failure: stopped first (the recovery sweep only looks at running instances),
    # its last heartbeat forgotten once it is down, so the sweep never records it as a dead or hung recovery.
    AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.STOPPED,
                                                       status_reason=f"restarting (by {actor.label})")
    if stop is not None:
        stop(tenant_spec(tenant), grace_s=settings.RUNTIME_STOP_GRACE_S)
    instance = AgentInstance.objects.filter(tenant=tenant).first()
    if instance is not None:
        heartbeat_store().forget(str(instance.pk))
    audit_record(actor=actor, action="instance.restart", tenant=tenant, data={"driver": driver.name})
    try:
        return instance_start(tenant=tenant, actor=actor)
    except Exception as exc:
        # Did not come back: failed, so the recovery sweep takes it from here (with its backoff and quarantine).
        AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.FAILED,
                                                           status_reason=f"restart failed: {exc}"[:2000])
        raise


def tenant_suspend(*, tenant: Tenant, actor: Actor, reason: str = "suspended by staff") -> Tenant:
    return tenant_transition(tenant=tenant, to=TenantStatus.SUSPENDED, actor=actor, reason=reason)


def tenant_resume(*, tenant: Tenant, actor: Actor) -> Tenant:
    return tenant_transition(tenant=tenant, to=TenantStatus.READY, actor=actor, reason="resumed by staff")


def tenant_keys_rotate(*, tenant: Tenant, actor: Actor) -> list[RotationJob]:
    """Rotate both of the tenant's data keys (credentials are re-encrypted; object keys get a new version)."""
    return [data_key_rotate_start(tenant=tenant, actor=actor, purpose=purpose)
            for purpose in (KeyPurpose.CREDENTIALS, KeyPurpose.OBJECTS)]
