"""Provisioning reads: recovery events and the figures behind /metrics."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from tenants.models import Tenant

from .choices import InstanceStatus, RecoveryOutcome
from .models import AgentInstance, RecoveryEvent

__all__ = ["recovery_event_list", "recovery_counts", "recovery_durations_s", "quarantined_count"]


def recovery_event_list(*, tenant: Tenant) -> QuerySet[RecoveryEvent]:
    return RecoveryEvent.objects.filter(tenant=tenant).order_by("-detected_at", "-id")


def recovery_counts() -> list[tuple[str, str, int]]:
    rows = RecoveryEvent.objects.values("reason", "outcome").annotate(n=Count("id")).order_by("reason", "outcome")
    return [(r["reason"], r["outcome"], r["n"]) for r in rows]


def recovery_durations_s() -> list[float]:
    rows = RecoveryEvent.objects.filter(outcome=RecoveryOutcome.SUCCEEDED, resumed_at__isnull=False)
    return [(resumed - detected).total_seconds() for detected, resumed in rows.values_list("detected_at", "resumed_at")]


def quarantined_count() -> int:
    return AgentInstance.objects.filter(status=InstanceStatus.QUARANTINED).count()
