"""Tenant lifecycle: the one function that changes ``Tenant.status``, checked against TENANT_TRANSITIONS."""

from __future__ import annotations

from django.db import transaction

from controlplane.errors import InvalidTransition

from .actors import Actor
from .audit import audit_record
from .audit_actions import AuditAction
from .choices import TENANT_TRANSITIONS
from .models import Tenant

__all__ = ["tenant_transition"]


def tenant_transition(*, tenant: Tenant, to: str, actor: Actor, reason: str = "") -> Tenant:
    """Move a tenant to ``to`` if the lifecycle allows it; a no-op when it is already there."""
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status == to:
            if reason and locked.status_reason != reason:
                locked.status_reason = reason
                locked.save(update_fields=["status_reason", "updated_at"])
        else:
            if to not in TENANT_TRANSITIONS[locked.status]:
                raise InvalidTransition(f"a {locked.status} tenant cannot become {to}")
            previous = locked.status
            locked.status = to
            locked.status_reason = reason
            locked.save(update_fields=["status", "status_reason", "updated_at"])
            audit_record(
                actor=actor, action=AuditAction.TENANT_TRANSITION, target=locked, tenant=locked,
                data={"from": previous, "to": to, "reason": reason},
            )
    tenant.status, tenant.status_reason = locked.status, locked.status_reason
    return tenant
