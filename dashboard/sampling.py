"""Writes the history the dashboard's charts draw: per-instance heartbeat age and fleet status, once a minute.

Instances keep only their current status and last heartbeat; without these samples "how did the fleet look
an hour ago" has no answer. One pass reads each instance's health exactly as the tenant page does
(``provisioning.recovery.health``: the live heartbeat store first), so a chart and the page it sits on agree.
A singleton (advisory lock) so a delayed queue never writes two samples of one minute. No reads for the
charts here: those are in ``history``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.locks import AdvisoryLock
from provisioning.models import AgentInstance
from provisioning.recovery.health import instance_health
from tenants.choices import TenantStatus

from .models import FleetSample, HeartbeatSample

__all__ = ["SampleResult", "history_sample", "samples_prune"]


@dataclass(frozen=True)
class SampleResult:
    ran: bool
    instances: int = 0
    pruned: int = 0


def history_sample(*, now: datetime | None = None) -> SampleResult:
    """Record one heartbeat sample per instance and one fleet sample, then prune what is past the retention."""
    with AdvisoryLock("dashboard-history-sample") as lock:
        if not lock.held:
            return SampleResult(ran=False)
        now = now or timezone.now()
        counts: Counter[str] = Counter()
        rows: list[HeartbeatSample] = []
        # A deleted tenant's instance is gone for good: counting it would make the fleet look larger than it is.
        live = AgentInstance.objects.exclude(tenant__status=TenantStatus.DELETED).order_by("pk")
        for instance in live.iterator(chunk_size=500):
            health = instance_health(instance, now)
            if health is None:  # only for no instance at all
                continue
            counts[health.label] += 1
            age = round(health.heartbeat_age_s, 1) if health.heartbeat_age_s is not None else None
            rows.append(HeartbeatSample(tenant_id=instance.tenant_id, taken_at=now, age_s=age, label=health.label))
        with transaction.atomic():
            HeartbeatSample.objects.bulk_create(rows, batch_size=1000)
            FleetSample.objects.create(taken_at=now, counts=dict(counts))
        return SampleResult(ran=True, instances=len(rows), pruned=samples_prune(now=now))


def samples_prune(*, now: datetime | None = None) -> int:
    """Delete samples older than ``DASHBOARD_SAMPLE_RETENTION_DAYS`` (both tables, by their time index)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.DASHBOARD_SAMPLE_RETENTION_DAYS)
    beats, _ = HeartbeatSample.objects.filter(taken_at__lt=cutoff).delete()
    fleet, _ = FleetSample.objects.filter(taken_at__lt=cutoff).delete()
    return beats + fleet
