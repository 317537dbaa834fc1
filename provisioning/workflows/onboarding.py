"""A tenant's start and end as provisioning workflows: onboard (the tenant, its instance row, the onboarding
run) and deprovision. The API, the portal, the dashboard and the benchmarks all call these two.

The tenant's own rules (slug, name, plan, metadata) are ``tenants.services``'; this module adds what
provisioning owns (the ``AgentInstance`` row, the workflow run), in the same transaction.
"""

from __future__ import annotations

import hashlib
import json

from django.db import transaction

from controlplane.errors import Conflict, NoDefaultRelease, QuotaExceeded
from controlplane.strict import validate_idempotency_key
from provisioning.choices import WorkflowKind
from provisioning.models import AgentInstance
from provisioning.resources.contributions import operator_default_release
from provisioning.services import workflow_start
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Operator, Tenant
from tenants.services import (
    IdempotencyMismatch,
    plan_for_new_tenant,
    validate_metadata,
    validate_name,
    validate_slug,
)

__all__ = ["tenant_onboard", "tenant_deprovision"]


def tenant_onboard(
    *, operator: Operator, slug: str, name: str, actor: Actor, plan: str = "standard",
    idempotency_key: str | None = None, metadata: dict[str, str] | None = None, allow_no_release: bool = False,
) -> tuple[Tenant, bool]:
    """Create a tenant and start its onboarding workflow. Returns (tenant, created).

    With an idempotency key, a retry with the same body returns the first tenant; the same
    key with a different body is refused (422). A live tenant with the same slug is 409.
    While the operator has no default release the customer would run no release of its own, only what the
    runtime has installed: refused (409 ``no-default-release``) unless ``allow_no_release`` says it is meant.
    """
    slug = validate_slug(slug)
    name = validate_name(name)
    idempotency_key = validate_idempotency_key(idempotency_key)
    metadata = {k: v for k, v in validate_metadata(metadata or {}).items() if v != ""}
    fingerprint = hashlib.sha256(json.dumps([slug, name, plan] + ([metadata] if metadata else []),
                                            sort_keys=True).encode()).hexdigest()
    with transaction.atomic():
        # Serializes onboarding per operator: quota, slug and idempotency checks cannot race.
        Operator.objects.select_for_update().get(pk=operator.pk)
        if idempotency_key is not None:
            existing = Tenant.objects.filter(operator=operator, idempotency_key=idempotency_key).first()
            if existing is not None:
                if existing.request_fingerprint != fingerprint:
                    raise IdempotencyMismatch("this Idempotency-Key was already used with a different body")
                return existing, False
        chosen = plan_for_new_tenant(plan)
        releases_here, default_release = operator_default_release(operator)
        if releases_here and default_release is None and not allow_no_release:
            raise NoDefaultRelease(
                "the operator has no default release: this customer would run no release of yours. Make a release "
                "the default (PUT /api/v1/releases/default), or send allow_no_release: true to onboard it anyway")
        live = Tenant.objects.filter(operator=operator).exclude(status=TenantStatus.DELETED)
        if live.filter(slug=slug).exists():
            raise Conflict(f"a tenant with slug {slug!r} already exists")
        if live.count() >= operator.tenant_quota:
            raise QuotaExceeded(f"operator quota of {operator.tenant_quota} tenants reached")
        tenant = Tenant.objects.create(
            operator=operator, slug=slug, name=name, plan=chosen, metadata=metadata,
            idempotency_key=idempotency_key, request_fingerprint=fingerprint,
        )
        AgentInstance.objects.create(tenant=tenant)
        audit_record(actor=actor, action=AuditAction.TENANT_ONBOARD, target=tenant, tenant=tenant,
                     data={"slug": slug, "release": default_release if releases_here else None})
        workflow_start(tenant=tenant, kind=WorkflowKind.ONBOARD, actor=actor)
    return tenant, True


def tenant_deprovision(*, tenant: Tenant, actor: Actor) -> Tenant:
    """Start deprovisioning (idempotent: a tenant already on its way out is returned as is)."""
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if tenant.status in (TenantStatus.DEPROVISIONING, TenantStatus.DELETED):
            return tenant
        tenant_transition(tenant=tenant, to=TenantStatus.DEPROVISIONING, actor=actor)
        workflow_start(tenant=tenant, kind=WorkflowKind.DEPROVISION, actor=actor)
    return tenant
