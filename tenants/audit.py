"""Audit trail writes. Call inside the transaction of the change being recorded (Zulip's habit).

The actions are the members of ``tenants.audit_actions.AuditAction``, re-exported here. Apps above this one
learn of each row through ``audit_recorded`` (webhooks records the public event it describes); this module
imports none of them.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.dispatch import Signal

from .actors import Actor
from .audit_actions import AuditAction
from .models import AuditLog, Operator, Tenant

__all__ = ["AuditAction", "audit_record", "audit_recorded", "audit_row", "audit_row_recorded"]

# Sent by ``audit_record`` for every row, with ``row`` (the AuditLog) and ``tenant`` (or None), synchronously and
# inside the caller's transaction, never on commit: a receiver's writes (webhooks' event and its deliveries,
# connected in ``WebhooksConfig.ready``) commit or roll back with the change they describe, and a receiver that
# raises fails the change. Side effects outside the database belong in the receiver's own on_commit.
audit_recorded = Signal()


def audit_row(
    *,
    actor: Actor,
    action: AuditAction,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    operator: Operator | None = None,
    data: dict[str, Any] | None = None,
) -> AuditLog:
    """The row ``audit_record`` writes, unsaved: for a hot path that inserts it in a statement of its own (issue
    39: the inbox writes its item and this row in one). Such a caller must call ``audit_row_recorded`` once the
    row is in, inside the same transaction."""
    if not isinstance(action, AuditAction):
        raise TypeError(f"audit_record takes an AuditAction member, not {type(action).__name__} {action!r}")
    operator_id = operator.pk if operator is not None else (tenant.operator_id if tenant is not None else None)
    return AuditLog(
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


def audit_row_recorded(row: AuditLog, tenant: Tenant | None) -> None:
    """``audit_recorded`` for a row just inserted (by ``audit_record``, or by the caller of ``audit_row``)."""
    audit_recorded.send(sender=AuditLog, row=row, tenant=tenant)


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

    The changes operators subscribe to also become a public event (and its webhook deliveries) in the same
    transaction, through ``audit_recorded``, so no state change is ever without its event (``webhooks.apps``).
    """
    row = audit_row(actor=actor, action=action, target=target, tenant=tenant, operator=operator, data=data)
    row.save(force_insert=True)
    audit_row_recorded(row, tenant)
    return row
