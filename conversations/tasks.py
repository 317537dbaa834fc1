"""Celery tasks of the inbox: ids in, one service call. Delivery is idempotent, so no retry policy here:
whatever is left pending is picked up by the next beat (every few seconds)."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from tenants.models import Tenant

from .selectors import tenant_has_pending_items, tenants_with_pending_items
from .services import inbox_deliver

__all__ = ["inbox_deliver_pending", "inbox_deliver_tenant", "inbox_deliver_soon", "inbox_on_heartbeat",
           "inbox_on_heartbeat_received"]


@shared_task(acks_late=True)
def inbox_deliver_pending() -> int:
    """Beat: every tenant with pending items (one query), delivered in turn."""
    settled = 0
    for tenant in Tenant.objects.filter(pk__in=tenants_with_pending_items()).select_related("operator"):
        settled += inbox_deliver(tenant=tenant)
    return settled


@shared_task(acks_late=True)
def inbox_deliver_tenant(tenant_id: str) -> int:
    tenant = Tenant.objects.filter(pk=tenant_id).select_related("operator").first()
    return 0 if tenant is None else inbox_deliver(tenant=tenant)


def inbox_deliver_soon(*, tenant_id: str) -> None:
    """Queue delivery for one tenant after the current transaction commits (e.g. on a ready heartbeat)."""
    transaction.on_commit(lambda: inbox_deliver_tenant.delay(str(tenant_id)))


# Heartbeat statuses of an instance that can take deliveries (the runtime's ProgressTracker).
READY_HEARTBEAT_STATUSES = frozenset({"idle", "working"})


def inbox_on_heartbeat(*, tenant_id: object, status: str | None) -> None:
    """The heartbeat hook: a ready instance with items waiting gets them now, not at the next beat.

    Called on ``instances.signals.heartbeat_received`` (connected in ``ConversationsConfig.ready``)."""
    if status not in READY_HEARTBEAT_STATUSES:
        return
    if tenant_has_pending_items(tenant_id=tenant_id):
        inbox_deliver_soon(tenant_id=str(tenant_id))


def inbox_on_heartbeat_received(sender: object, *, tenant_id: object, status: str | None, **_: object) -> None:
    """``heartbeat_received``'s receiver (the instance API sends it after recording a heartbeat)."""
    inbox_on_heartbeat(tenant_id=tenant_id, status=status)
