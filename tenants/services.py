"""Operator and tenant writes: create an operator, change a tenant; the rules a tenant's fields follow.

Onboarding and deprovisioning start provisioning workflows, so they live above this app, in
``provisioning.workflows.onboarding``, which reads the rules here (slug, name, plan, metadata).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db import transaction

from controlplane.errors import ApplicationError, Conflict, ValidationFailed

from .actors import Actor
from .audit import audit_record
from .audit_actions import AuditAction
from .choices import TenantStatus
from .models import Operator, Plan, Tenant

__all__ = ["operator_create", "tenant_update", "IdempotencyMismatch", "validate_slug", "validate_name",
           "plan_for_new_tenant", "validate_metadata", "SLUG_RE", "NAME_RE"]

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


# At least one character that is not an ASCII space; no control characters (the API schema says the same).
NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]*[^\x00-\x20\x7f][^\x00-\x1f\x7f]*$")


def validate_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > 200 or not NAME_RE.fullmatch(name):
        raise ValidationFailed("name must be 1-200 characters, not only spaces, without control characters")
    return name.strip(" ")


METADATA_MAX_KEYS = 50
METADATA_KEY_MAX = 40
METADATA_VALUE_MAX = 500


def plan_for_new_tenant(slug: object) -> Plan:
    """The plan a tenant may be put on: an active record, and one the runtime can size (Kubernetes)."""
    plan = Plan.objects.filter(slug=slug, is_active=True).first() if isinstance(slug, str) else None
    if plan is None:
        offered = ", ".join(Plan.objects.filter(is_active=True).values_list("slug", flat=True)) or "none"
        raise ValidationFailed(f"plan {slug!r} is not offered (available: {offered})")
    if settings.PROVISIONING_PROFILE == "kubernetes" and plan.slug not in settings.KUBERNETES_PLANS:
        raise ValidationFailed(f"plan {plan.slug!r} has no Kubernetes resources configured (KUBERNETES_PLANS)")
    return plan


def validate_metadata(metadata: object) -> dict[str, str]:
    """Stripe's rules: at most 50 keys of up to 40 characters, string values of up to 500; a value "" deletes."""
    if not isinstance(metadata, dict):
        raise ValidationFailed("metadata must be an object of string keys and string values")
    if len(metadata) > METADATA_MAX_KEYS:
        raise ValidationFailed(f"metadata takes at most {METADATA_MAX_KEYS} keys")
    for key, value in metadata.items():
        if (not isinstance(key, str) or not 1 <= len(key) <= METADATA_KEY_MAX or "[" in key or "]" in key
                or "\x00" in key):
            raise ValidationFailed(f"metadata keys must be 1-{METADATA_KEY_MAX} characters without brackets or NUL")
        if not isinstance(value, str) or len(value) > METADATA_VALUE_MAX:
            raise ValidationFailed(f"metadata[{key!r}] must be a string of at most {METADATA_VALUE_MAX} characters")
    return dict(metadata)


def operator_create(*, slug: str, name: str, actor: Actor, domains: list[str] | None = None) -> Operator:
    slug = validate_slug(slug)
    with transaction.atomic():
        if Operator.objects.filter(slug=slug).exists():
            raise Conflict(f"an operator with slug {slug!r} already exists")
        operator = Operator.objects.create(slug=slug, name=validate_name(name), domains=domains or [],
                                           product_name=validate_name(name))
        audit_record(actor=actor, action=AuditAction.OPERATOR_CREATE, target=operator, operator=operator)
    return operator


def tenant_update(*, tenant: Tenant, actor: Actor, name: str | None = None, plan: str | None = None,
                  metadata: dict[str, str] | None = None) -> Tenant:
    """PATCH: change the name, move to another offered plan, merge metadata (a value "" removes its key).

    A plan change is recorded; in the Kubernetes profile the instance's quota follows at its next ensure
    (a restart or a recovery), the running pod is not resized behind the customer's back.
    """
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status in (TenantStatus.DEPROVISIONING, TenantStatus.DELETED):
            raise Conflict(f"a {locked.status} tenant cannot be changed")
        changes: dict[str, object] = {}
        if name is not None and (clean := validate_name(name)) != locked.name:
            changes["name"] = {"from": locked.name, "to": clean}
            locked.name = clean
        if plan is not None and plan != locked.plan_id:
            changes["plan"] = {"from": locked.plan_id, "to": plan}
            locked.plan = plan_for_new_tenant(plan)
        if metadata is not None:
            merged = {**locked.metadata, **validate_metadata(metadata)}
            merged = {k: v for k, v in merged.items() if v != ""}
            if len(merged) > METADATA_MAX_KEYS:
                raise ValidationFailed(f"metadata takes at most {METADATA_MAX_KEYS} keys")
            if merged != locked.metadata:
                changes["metadata"] = sorted(set(merged) ^ set(locked.metadata) | {
                    k for k in merged if locked.metadata.get(k) != merged[k]})
                locked.metadata = merged
        if changes:
            locked.save(update_fields=["name", "plan", "metadata", "updated_at"])
            audit_record(actor=actor, action=AuditAction.TENANT_UPDATE, target=locked, tenant=locked, data=changes)
    return locked
