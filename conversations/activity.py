"""The inbox as an activity source of ``provisioning.resources.contributions``: what it holds for a tenant keeps
the tenant's instance awake, wakes it when asleep, and is delivered once the wake has read the instance back.

Registered from ``ConversationsConfig.ready()``; provisioning's sleeper and waker call these, never the inbox's
models. The other direction (an accepted item asks for a wake) is ``conversations.services`` calling
``provisioning.fleet.sleep.instance_activity``.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from provisioning.resources.contributions import ActivitySource
from tenants.models import Tenant

from .choices import InboxStatus
from .models import InboxItem
from .services import inbox_deliver

__all__ = ["INBOX_ACTIVITY"]

# The instance reads its inbox for this long after a wake before the waker records what it took.
WAKE_DELIVERY_WAIT_S = 5.0


def _waiting() -> QuerySet[InboxItem]:
    return InboxItem.objects.filter(status=InboxStatus.PENDING)


def _since(cutoff: datetime) -> QuerySet[InboxItem]:
    return InboxItem.objects.filter(created_at__gte=cutoff)


def _oldest_waiting(tenant: Tenant) -> datetime | None:
    return (_waiting().filter(tenant=tenant).order_by("created_at").values_list("created_at", flat=True).first())


def _deliver(tenant: Tenant, accepted_since: datetime) -> datetime | None:
    inbox_deliver(tenant=tenant, wait_s=WAKE_DELIVERY_WAIT_S)
    return (InboxItem.objects.filter(tenant_id=tenant.pk, created_at__gte=accepted_since, delivered_at__isnull=False)
            .order_by("delivered_at").values_list("delivered_at", flat=True).first())


INBOX_ACTIVITY = ActivitySource(name="inbox items", waiting=_waiting, since=_since, oldest_waiting=_oldest_waiting,
                                deliver=_deliver)
