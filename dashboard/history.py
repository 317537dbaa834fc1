"""Reads for the history charts: heartbeat age and time to recover per tenant, fleet status over time.

Read-only. Samples come from ``dashboard.sampling`` (one a minute); time to recover from provisioning's
``RecoveryEvent`` rows. A long window is thinned to at most ``MAX_POINTS`` points per chart (the worst
heartbeat age in a bucket, the last fleet count in it), so a week is as cheap to draw as an hour.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from provisioning.models import RecoveryEvent
from tenants.models import Tenant

from .models import FleetSample, HeartbeatSample

__all__ = ["WINDOWS", "DEFAULT_WINDOW", "FLEET_LABELS", "History", "window_choose", "heartbeat_age_history",
           "fleet_history", "fleet_latest", "recovery_times"]

WINDOWS: dict[str, timedelta] = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24),
                                 "7d": timedelta(days=7)}
DEFAULT_WINDOW = "24h"
MAX_POINTS = 240
# Stacked bottom to top: healthy first, the states that need a person last (on top, where the eye lands).
FLEET_LABELS = ("healthy", "asleep", "starting", "pending", "stopped", "stale", "recovering", "failed", "quarantined")


@dataclass(frozen=True)
class History:
    start: datetime
    end: datetime
    times: list[datetime]
    series: list[tuple[str, list[float | None]]]
    samples: int  # rows read (before thinning); 0 means "nothing sampled in this window yet"
    gap_s: float | None  # neighbouring points further apart than this were not sampled in between


def window_choose(value: str | None) -> str:
    """A known window name; anything else (a typo, an attack) is the default."""
    return value if value in WINDOWS else DEFAULT_WINDOW


def _bounds(window: str, now: datetime | None) -> tuple[datetime, datetime]:
    end = now or timezone.now()
    return end - WINDOWS[window_choose(window)], end


def _gap(times: list[datetime], bucket_s: float) -> float | None:
    """Three typical spacings: a missed sample or two is a dip, a longer hole is a hole."""
    if len(times) < 2:
        return None
    spacing = statistics.median((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    return 3 * max(spacing, bucket_s)


def _thin(rows: Iterable[tuple[datetime, Any]], start: datetime, end: datetime, count: int,
          keep: str) -> tuple[list[datetime], list[Any], float]:
    """At most ``MAX_POINTS`` (time, value) pairs: rows as they are, or one per bucket (``keep``: max | last)."""
    rows = list(rows)
    if count <= MAX_POINTS:
        return [t for t, _ in rows], [v for _, v in rows], 0.0
    bucket_s = (end - start).total_seconds() / MAX_POINTS
    times: list[datetime] = []
    values: list[Any] = []
    current = -1
    for t, v in rows:
        index = int((t - start).total_seconds() // bucket_s)
        if index != current:
            current = index
            times.append(t)
            values.append(v)
        elif keep == "last":
            times[-1], values[-1] = t, v
        elif v is not None and (values[-1] is None or v > values[-1]):
            values[-1] = v
    return times, values, bucket_s


def heartbeat_age_history(tenant: Tenant, *, window: str = DEFAULT_WINDOW, now: datetime | None = None) -> History:
    start, end = _bounds(window, now)
    qs = HeartbeatSample.objects.filter(tenant=tenant, taken_at__gte=start, taken_at__lte=end).order_by("taken_at")
    count = qs.count()
    times, ages, bucket_s = _thin(qs.values_list("taken_at", "age_s"), start, end, count, keep="max")
    return History(start=start, end=end, times=times, series=[("heartbeat age", ages)], samples=count,
                   gap_s=_gap(times, bucket_s))


def fleet_history(*, window: str = DEFAULT_WINDOW, now: datetime | None = None) -> History:
    start, end = _bounds(window, now)
    qs = FleetSample.objects.filter(taken_at__gte=start, taken_at__lte=end).order_by("taken_at")
    count = qs.count()
    times, counts, bucket_s = _thin(qs.values_list("taken_at", "counts"), start, end, count, keep="last")
    seen = {label for c in counts for label, n in c.items() if n}
    labels = [label for label in FLEET_LABELS if label in seen] + sorted(seen - set(FLEET_LABELS))
    series: list[tuple[str, list[float | None]]] = [(label, [float(c.get(label, 0)) for c in counts])
                                                     for label in labels]
    return History(start=start, end=end, times=times, series=series, samples=count, gap_s=_gap(times, bucket_s))


def fleet_latest(labels: list[str], *, limit: int = 10) -> list[tuple[datetime, list[int], int]]:
    """The newest samples as (taken at, count per label in ``labels``' order, all instances): the table under
    the chart, so its numbers can be checked against the picture."""
    latest = FleetSample.objects.order_by("-taken_at")[:limit]
    return [(s.taken_at, [int(s.counts.get(label, 0)) for label in labels], sum(s.counts.values())) for s in latest]


def recovery_times(tenant: Tenant, *, limit: int = 30) -> list[tuple[str, float | None]]:
    """The tenant's last ``limit`` recoveries oldest first as (when, seconds to resume or None if it did not)."""
    events = list(RecoveryEvent.objects.filter(tenant=tenant).order_by("-detected_at", "-id")[:limit])
    return [(f"{e.detected_at:%m-%d %H:%M}", e.time_to_recover_s) for e in reversed(events)]
