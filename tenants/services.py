"""Operator and tenant writes: create an operator, onboard and deprovision a tenant."""

from __future__ import annotations

import hashlib
import json
import re

from django.db import transaction

from controlplane.errors import ApplicationError, Conflict, QuotaExceeded, ValidationFailed
from provisioning.choices import WorkflowKind
from provisioning.models import AgentInstance
from provisioning.services import workflow_start

from .actors import Actor
from .audit import audit_record
from .choices import TenantStatus
from .lifecycle import tenant_transition
from .models import Operator, Tenant

__all__ = ["operator_create", "tenant_onboard", "tenant_deprovision", "IdempotencyMismatch", "validate_slug"]

SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# Not dangerous (slugs never reach SQL), but confusing in every listing: refused outright.
RESERVED_SLUGS = frozenset(
    {"public", "pg_catalog", "information_schema", "pg_toast", "postgres", "template0", "template1",
     "admin", "root", "api", "internal", "system", "default", "kube-system", "kube-public"}
)


class IdempotencyMismatch(ApplicationError):
    status_code = 422
    title = "Idempotency key reused"
    type_slug = "idempotency-key-reused"


def validate_slug(slug: object) -> str:
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        raise ValidationFailed(
            "slug must be 1-63 characters of lowercase letters, digits and '-', starting and ending "
            "with a letter or digit"
        )
    if slug in RESERVED_SLUGS or slug.startswith("pg-"):
        raise ValidationFailed(f"slug {slug!r} is reserved")
    return slug


def _validate_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationFailed("name must be 1-200 characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise ValidationFailed("name must not contain control characters")
    return name.strip()


def operator_create(*, slug: str, name: str, actor: Actor, domains: list[str] | None = None) -> Operator:
    slug = validate_slug(slug)
    with transaction.atomic():
        if Operator.objects.filter(slug=slug).exists():
            raise Conflict(f"an operator with slug {slug!r} already exists")
        operator = Operator.objects.create(slug=slug, name=_validate_name(name), domains=domains or [],
                                           product_name=_validate_name(name))
        audit_record(actor=actor, action="operator.create", target=operator, operator=operator)
    return operator


def tenant_onboard(
    *, operator: Operator, slug: str, name: str, actor: Actor, plan: str = "standard",
    idempotency_key: str | None = None,
) -> tuple[Tenant, bool]:
    """Create a tenant and start its onboarding workflow. Returns (tenant, created).

    With an idempotency key, a retry with the same body returns the first tenant; the same
    key with a different body is refused (422). A live tenant with the same slug is 409.
    """
    slug = validate_slug(slug)
    name = _validate_name(name)
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 200):
        raise ValidationFailed("Idempotency-Key must be 1-200 characters")
    fingerprint = hashlib.sha256(json.dumps([slug, name, plan]).encode()).hexdigest()
    with transaction.atomic():
        # Serializes onboarding per operator: quota, slug and idempotency checks cannot race.
        Operator.objects.select_for_update().get(pk=operator.pk)
        if idempotency_key is not None:
            existing = Tenant.objects.filter(operator=operator, idempotency_key=idempotency_key).first()
            if existing is not None:
                if existing.request_fingerprint != fingerprint:
                    raise IdempotencyMismatch("this Idempotency-Key was already used with a different body")
                return existing, False
        live = Tenant.objects.filter(operator=operator).exclude(status=TenantStatus.DELETED)
        if live.filter(slug=slug).exists():
            raise Conflict(f"a tenant with slug {slug!r} already exists")
        if live.count() >= operator.tenant_quota:
            raise QuotaExceeded(f"operator quota of {operator.tenant_quota} tenants reached")
        tenant = Tenant.objects.create(
            operator=operator, slug=slug, name=name, plan=plan,
            idempotency_key=idempotency_key, request_fingerprint=fingerprint,
        )
        AgentInstance.objects.create(tenant=tenant)
        audit_record(actor=actor, action="tenant.onboard", target=tenant, tenant=tenant, data={"slug": slug})
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
