"""Which audit actions are public events, and what each event says. No I/O here.

``tenants.audit.audit_record`` is the one choke point every state change passes through; it hands each row
to ``webhooks.services.event_record_from_audit``, which asks ``event_from_audit`` below. Event data carries
ids, names and statuses only: audit data can hold internal detail (reasons naming hosts or paths) that an
operator's receiver has no business seeing, so nothing is passed through unfiltered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus

from .choices import EventType

__all__ = ["PUBLIC_ACTIONS", "PublicEvent", "event_from_audit"]


@dataclass(frozen=True)
class PublicEvent:
    type: str
    data: dict[str, Any]


_TENANT_STATUS_EVENTS = {
    TenantStatus.PROVISIONING: EventType.TENANT_PROVISIONING,
    TenantStatus.READY: EventType.TENANT_READY,
    TenantStatus.DEGRADED: EventType.TENANT_DEGRADED,
    TenantStatus.RECOVERING: EventType.TENANT_RECOVERING,
    TenantStatus.SUSPENDED: EventType.TENANT_SUSPENDED,
    TenantStatus.FAILED: EventType.TENANT_FAILED,
    TenantStatus.DEPROVISIONING: EventType.TENANT_DEPROVISIONING,
    TenantStatus.DELETED: EventType.TENANT_DELETED,
}
_INSTANCE_EVENTS = {
    AuditAction.INSTANCE_START: EventType.INSTANCE_STARTED,
    AuditAction.INSTANCE_STOP: EventType.INSTANCE_STOPPED,
    AuditAction.INSTANCE_KILL: EventType.INSTANCE_KILLED,
    AuditAction.INSTANCE_RESTART: EventType.INSTANCE_RESTARTED,
}
_RECOVERY_OUTCOMES = {
    AuditAction.INSTANCE_RECOVERY_SUCCEEDED: EventType.RECOVERY_SUCCEEDED,
    AuditAction.INSTANCE_RECOVERY_FAILED: EventType.RECOVERY_FAILED,
    AuditAction.INSTANCE_RECOVERY_QUARANTINED: EventType.RECOVERY_QUARANTINED,
}


def _pick(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: data[k] for k in keys if k in data}


def _tenant_transition(data: dict[str, Any], slug: str | None) -> PublicEvent | None:
    to, previous = data.get("to"), data.get("from")
    kind = _TENANT_STATUS_EVENTS.get(to)  # type: ignore[arg-type]
    if kind is None:
        return None
    if to == TenantStatus.READY and previous == TenantStatus.SUSPENDED:
        kind = EventType.TENANT_RESUMED
    return PublicEvent(kind, {"slug": slug, "status": to, "previous_status": previous})


def _instance_event(kind: EventType, d: dict[str, Any], t: str, slug: str | None, status: str | None) -> PublicEvent:
    return PublicEvent(kind, _pick(d, "planned"))


def _recovery_outcome(kind: EventType, d: dict[str, Any], t: str, slug: str | None, status: str | None) -> PublicEvent:
    return PublicEvent(kind, {"recovery": t, **_pick(d, "steps_lost")})


# (data, target_id, tenant slug, tenant status) -> the event. Keyed by member, so an action renamed or removed
# breaks this import; tests/tenants/test_audit_actions.py checks every public event type still has an action here.
_Builder = Callable[[dict[str, Any], str, "str | None", "str | None"], "PublicEvent | None"]
_BUILDERS: dict[AuditAction, _Builder] = {
    AuditAction.TENANT_ONBOARD: lambda d, t, slug, status: PublicEvent(
        EventType.TENANT_CREATED, {"slug": slug, "status": status}),
    AuditAction.TENANT_UPDATE: lambda d, t, slug, status: PublicEvent(
        EventType.TENANT_UPDATED, {"slug": slug, "changed": sorted(d)}),
    AuditAction.TENANT_TRANSITION: lambda d, t, slug, status: _tenant_transition(d, slug),
    **{action: partial(_instance_event, kind) for action, kind in _INSTANCE_EVENTS.items()},
    AuditAction.INSTANCE_RECOVERY_START: lambda d, t, slug, status: PublicEvent(
        EventType.RECOVERY_STARTED, {"recovery": t, **_pick(d, "reason")}),
    **{action: partial(_recovery_outcome, kind) for action, kind in _RECOVERY_OUTCOMES.items()},
    AuditAction.TASK_SUBMIT: lambda d, t, slug, status: PublicEvent(
        EventType.TASK_SUBMITTED, {"inbox_item": d.get("item"), **_pick(d, "kind")}),
    AuditAction.INSTANCE_SUBMIT_TASK: lambda d, t, slug, status: PublicEvent(
        EventType.TASK_SUBMITTED, _pick(d, "task", "kind")),
    AuditAction.TASK_CANCEL: lambda d, t, slug, status: PublicEvent(
        EventType.TASK_CANCEL_REQUESTED, {"inbox_item": d.get("item"), **_pick(d, "task")}),
    AuditAction.EFFECT_DECIDE: lambda d, t, slug, status: PublicEvent(
        EventType.EFFECT_DECIDED, {"inbox_item": d.get("item"), **_pick(d, "effect", "decision")}),
    # Connected accounts: ids, provider names, statuses; never a token (audit data holds none either).
    AuditAction.CONNECTION_CREATE: lambda d, t, slug, status: PublicEvent(
        EventType.CONNECTION_CREATED, {"connection": t, **_pick(d, "provider", "end_user", "account_id", "scopes")}),
    AuditAction.CONNECTION_NEEDS_REAUTH: lambda d, t, slug, status: PublicEvent(
        EventType.CONNECTION_NEEDS_REAUTH, {"connection": t, **_pick(d, "provider", "reason")}),
    AuditAction.CONNECTION_DISCONNECT: lambda d, t, slug, status: PublicEvent(
        EventType.CONNECTION_DISCONNECTED, {"connection": t, **_pick(d, "provider", "provider_revocation")}),
}
# The audit actions that can become a public event; every other action stays internal (tokens, vault, ...).
PUBLIC_ACTIONS: frozenset[AuditAction] = frozenset(_BUILDERS)


def event_from_audit(*, action: str, data: dict[str, Any], target_id: str, tenant_slug: str | None,
                     tenant_status: str | None) -> PublicEvent | None:
    """The public event an audit row describes, or None when it is internal (tokens, vault, resources...).

    ``action`` is the stored string (``AuditLog.action``); a member's value looks up the same entry.
    """
    build = _BUILDERS.get(action)  # type: ignore[call-overload]
    return build(data, target_id, tenant_slug, tenant_status) if build is not None else None
