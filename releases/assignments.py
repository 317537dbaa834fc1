"""Which release each tenant runs, the operator's default, and moving one tenant's instance to a release.

The one implementation behind pinning (API, portal) and rollouts: the assignment is committed first,
then the instance is stopped at a step boundary and started again on its release, and the switch
counts only once the instance's own boot record names that release (what it really loaded, not what
we asked for).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.errors import InvalidTransition, ProvisioningError, ValidationFailed
from provisioning.choices import InstanceStatus, ResourceKind
from provisioning.drivers.pg_admin import tenant_admin_connect
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import runtime_driver
from provisioning.fleet.actions import RESTARTABLE, instance_restart_request, instance_stop_planned
from provisioning.fleet.instances import instance_start
from provisioning.models import AgentInstance, ProvisionedResource
from provisioning.resources import runtime_tables
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator, Tenant

from .config_fit import agent_config_misfit
from .models import AgentRelease, DefaultRelease, ReleaseAssignment
from .selectors import release_get

__all__ = ["assignment_switch", "step_downtime_ms", "release_default_set", "tenant_release_initial",
           "tenant_release_seen", "tenant_release_pin", "tenant_release_switch", "booted_release"]


def release_default_set(*, operator: Operator, release_id: object, actor: Actor) -> DefaultRelease:
    """Make a release the one new customers start on. Running tenants are not touched (a rollout moves them)."""
    release = release_get(operator=operator, release_id=release_id)
    default, _ = DefaultRelease.objects.update_or_create(operator=operator, defaults={"release": release})
    audit_record(actor=actor, action=AuditAction.RELEASE_DEFAULT, target=release, operator=operator,
                 data={"version": release.version})
    return default


def _unrecorded_release_id(tenant: Tenant) -> object | None:
    """What a tenant with no assignment runs or will run: an instance that already ran before assignments
    existed runs the runtime's agents (and keeps doing so until a rollout or a pin moves it); one that never
    started starts on the operator's default."""
    if ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.RUNTIME).exists():
        return None
    default = DefaultRelease.objects.filter(operator_id=tenant.operator_id).first()
    return default.release_id if default else None


def tenant_release_initial(*, tenant: Tenant) -> ReleaseAssignment:
    """The tenant's assignment, recorded the first time it is needed (see ``_unrecorded_release_id``)."""
    assignment = ReleaseAssignment.objects.filter(tenant=tenant).first()
    if assignment is not None:
        return assignment
    assignment, _ = ReleaseAssignment.objects.get_or_create(
        tenant=tenant, defaults={"release_id": _unrecorded_release_id(tenant)})
    return assignment


def tenant_release_seen(tenant: Tenant) -> ReleaseAssignment:
    """The tenant's assignment for a read, without recording one (an unsaved instance when there is none)."""
    assignment = ReleaseAssignment.objects.filter(tenant=tenant).select_related("release").first()
    return assignment or ReleaseAssignment(tenant=tenant, release_id=_unrecorded_release_id(tenant))


def tenant_release_pin(*, tenant: Tenant, release_id: object | None, pinned: bool, actor: Actor) -> ReleaseAssignment:
    """Pin the tenant to a release (or unpin it: it then follows the operator's default), restarting its
    instance in a worker when what it should run changed. 409 while a rollout is moving it or it cannot run."""
    from .rollouts import tenant_in_active_rollout

    if pinned and release_id is None:
        raise ValidationFailed("pinning needs a release")
    if pinned:
        release: AgentRelease | None = release_get(operator=tenant.operator, release_id=release_id)
    else:
        default = DefaultRelease.objects.filter(operator_id=tenant.operator_id).select_related("release").first()
        release = default.release if default else None
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if tenant_in_active_rollout(locked):
            raise InvalidTransition("a rollout is moving this tenant; pause or abort it first")
        assignment = tenant_release_initial(tenant=locked)
        changed = assignment.release_id != (release.pk if release else None)
        if changed and locked.status not in RESTARTABLE:
            raise InvalidTransition(f"a {locked.status} tenant cannot switch release")
        misfit = agent_config_misfit(tenant=locked, release=release) if changed else None
        if misfit is not None:
            field = misfit.split(":", 1)[0]
            raise ValidationFailed(f"the customer's configuration does not fit release "
                                   f"{release.version if release else ''}: {misfit}; change its overrides first "
                                   "(PUT /api/v1/tenants/{id}/agent-config)", extra={"field": field})
        if changed:
            _retain_previous(assignment, release)
        assignment.release, assignment.pinned = release, pinned
        assignment.save()
        audit_record(actor=actor, action=AuditAction.RELEASE_PIN if pinned else AuditAction.RELEASE_UNPIN,
                     tenant=locked, data={"version": release.version if release else None, "restart": changed})
        if changed:
            instance_restart_request(tenant=locked, actor=actor)
    return assignment


def booted_release(tenant: Tenant, *, since: datetime | None) -> tuple[int, dict[str, Any] | None]:
    """Boots of the tenant's instance since ``since`` (None: ever) and the release its latest boot names."""
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        try:
            boots = runtime_tables.boots_since(conn, tenant.resource_name, since)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return 0, None  # its instance never ran: the runtime creates the table on its first boot
    return boots.boots, boots.release


def _digest_of(release: dict[str, Any] | None) -> str:
    return str((release or {}).get("digest") or "")


def step_downtime_ms(tenant: Tenant, *, stopped: datetime) -> int | None:
    """The tenant's downtime around a switch: its last step done before ``stopped`` -> its first one after
    (None while no step has finished on the new release, or when no task was running)."""
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        around = runtime_tables.steps_done_around(conn, tenant.resource_name, stopped)
    if around.last_before is None or around.first_after is None:
        return None
    return int((around.first_after - around.last_before).total_seconds() * 1000)


def assignment_switch(*, tenant: Tenant, release: AgentRelease | None) -> ReleaseAssignment:
    """Record that the tenant runs ``release`` from now on; the one it ran goes first in ``retained``.

    Under a row lock: two switches at once (a rollout and an operator's assignment) must not both keep the same
    previous release and lose another. Its tasks started on an earlier release finish there (docs/releases.md),
    so the instance keeps the last RELEASE_RETAINED_PER_TENANT of them loadable.
    """
    with transaction.atomic():
        assignment, _ = ReleaseAssignment.objects.select_for_update().get_or_create(tenant=tenant)
        _retain_previous(assignment, release)
        assignment.release = release
        assignment.save(update_fields=["release", "retained", "updated_at"])
    return assignment


def _retain_previous(assignment: ReleaseAssignment, release: AgentRelease | None) -> None:
    """Put the release the assignment names now first in its ``retained`` list, before it moves to ``release``
    (unsaved; the caller holds the assignment's row lock)."""
    if assignment.pk is not None and assignment.release_id == (release.pk if release is not None else None):
        return
    keep = [str(assignment.release_id) if assignment.release_id else ""]  # "": the runtime's agents
    new = str(release.pk) if release is not None else ""
    retained = [r for r in [*keep, *assignment.retained] if r != new]
    assignment.retained = list(dict.fromkeys(retained))[:settings.RELEASE_RETAINED_PER_TENANT]


def tenant_release_switch(*, tenant: Tenant, release: AgentRelease | None, actor: Actor, reason: str) -> datetime:
    """Move the tenant's instance to ``release`` now (in a worker: it waits for a step boundary); returns
    when it was stopped. Raises ProvisioningError when the instance does not come back on that release."""
    assignment_switch(tenant=tenant, release=release)
    began = timezone.now()
    if Capability.ROLLS_OUT_ITSELF in runtime_driver().capabilities:
        # Kubernetes: deleting the pod first would let its controller recreate it on the old template (two
        # restarts); the changed template is rolled out by the platform (graceful termination) in ensure().
        AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.STOPPED,
                                                           status_reason=reason[:2000])
    else:
        instance_stop_planned(tenant=tenant, actor=actor, reason=reason)
    stopped = timezone.now()
    instance_start(tenant=tenant, actor=actor)
    want = release.digest if release else ""
    deadline = time.monotonic() + settings.RECOVERY_VERIFY_TIMEOUT_S
    while True:
        boots, running = booted_release(tenant, since=began)
        if boots:
            if _digest_of(running) != want:
                raise ProvisioningError(f"the instance booted {_digest_of(running) or 'the runtime agents'}, "
                                        f"not {want or 'the runtime agents'}")
            return stopped
        if time.monotonic() > deadline:
            raise ProvisioningError("the instance did not record a boot after the switch")
        time.sleep(0.2)
