"""Which audit actions are public events, and what each event says. No I/O here.

``tenants.audit.audit_record`` is the one choke point every state change passes through; it hands each row
to ``webhooks.services.event_record_from_audit``, which asks ``event_from_audit`` below. Event data carries
ids, names and statuses only: audit data can hold internal detail (reasons naming hosts or paths) that an
operator's receiver has no business seeing, so nothing is passed through unfiltered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenants.choices import TenantStatus

from .choices import EventType

__all__ = ["PublicEvent", "event_from_audit"]


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
    "instance.start": EventType.INSTANCE_STARTED,
    "instance.stop": EventType.INSTANCE_STOPPED,
    "instance.kill": EventType.INSTANCE_KILLED,
    "instance.restart": EventType.INSTANCE_RESTARTED,
}
_RECOVERY_OUTCOMES = {
    "instance.recovery.succeeded": EventType.RECOVERY_SUCCEEDED,
    "instance.recovery.failed": EventType.RECOVERY_FAILED,
    "instance.recovery.quarantined": EventType.RECOVERY_QUARANTINED,
}


def _pick(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: data[k] for k in keys if k in data}


def event_from_audit(*, action: str, data: dict[str, Any], target_id: str, tenant_slug: str | None,
                     tenant_status: str | None) -> PublicEvent | None:
    """The public event an audit row describes, or None when it is internal (tokens, vault, resources...)."""
    if action == "tenant.onboard":
        return PublicEvent(EventType.TENANT_CREATED, {"slug": tenant_slug, "status": tenant_status})
    if action == "tenant.update":
        return PublicEvent(EventType.TENANT_UPDATED, {"slug": tenant_slug, "changed": sorted(data)})
    if action == "tenant.transition":
        to, previous = data.get("to"), data.get("from")
        kind = _TENANT_STATUS_EVENTS.get(to)  # type: ignore[arg-type]
        if kind is None:
            return None
        if to == TenantStatus.READY and previous == TenantStatus.SUSPENDED:
            kind = EventType.TENANT_RESUMED
        return PublicEvent(kind, {"slug": tenant_slug, "status": to, "previous_status": previous})
    if action in _INSTANCE_EVENTS:
        return PublicEvent(_INSTANCE_EVENTS[action], _pick(data, "planned"))
    if action == "instance.recovery.start":
        return PublicEvent(EventType.RECOVERY_STARTED, {"recovery": target_id, **_pick(data, "reason")})
    if action in _RECOVERY_OUTCOMES:
        return PublicEvent(_RECOVERY_OUTCOMES[action], {"recovery": target_id, **_pick(data, "steps_lost")})
    if action == "task.submit":
        return PublicEvent(EventType.TASK_SUBMITTED, {"inbox_item": data.get("item"), **_pick(data, "kind")})
    if action == "instance.submit_task":
        return PublicEvent(EventType.TASK_SUBMITTED, _pick(data, "task", "kind"))
    if action == "task.cancel":
        return PublicEvent(EventType.TASK_CANCEL_REQUESTED, {"inbox_item": data.get("item"), **_pick(data, "task")})
    if action == "effect.decide":
        return PublicEvent(EventType.EFFECT_DECIDED,
                           {"inbox_item": data.get("item"), **_pick(data, "effect", "decision")})
    return None
