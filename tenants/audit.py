"""Audit trail writes. Call inside the transaction of the change being recorded (Zulip's habit).

The actions are the members of ``tenants.audit_actions.AuditAction``, re-exported here.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from .actors import Actor
from .audit_actions import AuditAction
from .models import AuditLog, Operator, Tenant

__all__ = ["AuditAction", "audit_record"]


def audit_record(
    *,
    actor: Actor,
    action: AuditAction,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    operator: Operator | None = None,
    data: dict[str, Any] | None = None,
) -> AuditLog:
    """Write one audit row. ``data`` must never carry a secret; callers pass ids and names only.

    ``action`` must be an ``AuditAction`` member: a plain string (even one equal to a member's value) is refused,
    so an action cannot exist only as a literal that ``webhooks.events`` and the dashboards do not know.

    The changes operators subscribe to also become a public event (and its webhook deliveries) here, in
    the same transaction, so no state change is ever without its event (``webhooks.services``).
    """
    from webhooks.services import event_record_from_audit

    if not isinstance(action, AuditAction):
        raise TypeError(f"audit_record takes an AuditAction member, not {type(action).__name__} {action!r}")
    operator_id = operator.pk if operator is not None else (tenant.operator_id if tenant is not None else None)
    row = AuditLog.objects.create(
        actor_kind=actor.kind,
        actor_id=actor.id,
        actor_label=actor.label[:200],
        operator_id=operator_id,
        tenant=tenant,
        action=action,
        target_type=target._meta.label if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        data=data or {},
    )
    event_record_from_audit(row=row, tenant=tenant)
    return row
