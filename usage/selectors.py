"""Reads of ``UsageDay``: the rows of a period (API, CSV export) and their totals (the portal's usage card).

The API, the export and the customer page read these rows and nothing else, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.db.models import Max, Q, QuerySet, Sum
from django.utils import timezone

from controlplane.errors import ValidationFailed
from tenants.models import Operator, Tenant

from .models import UsageDay

__all__ = ["MAX_RANGE_DAYS", "UsageTotals", "usage_fleet_by_day", "usage_fleet_by_tenant", "usage_month_tokens",
           "usage_period", "usage_rows", "usage_totals"]

MAX_RANGE_DAYS = 366
_SUMMED = ("tasks_submitted", "tasks_done", "tasks_failed", "steps_run", "compute_s", "messages_in", "messages_out",
           "effects_committed", "input_tokens", "output_tokens")
_STORAGE = ("schema_bytes", "object_bytes", "volume_bytes")


def usage_period(start: date | None, end: date | None, *, now: datetime | None = None) -> tuple[date, date]:
    """``from`` and ``to`` (both included; UTC days). Neither: this month so far; only ``to``: its month."""
    today = (now or timezone.now()).astimezone(UTC).date()
    end = end or (today if start is None or start <= today else start)
    start = start or end.replace(day=1)
    if end < start:
        raise ValidationFailed("to is before from")
    if (end - start).days >= MAX_RANGE_DAYS:
        raise ValidationFailed(f"from and to span at most {MAX_RANGE_DAYS} days")
    return start, end


def usage_rows(*, operator: Operator, start: date, end: date, tenant: Tenant | None = None) -> QuerySet[UsageDay]:
    """The operator's customers' days in the period, by day then customer (one customer's with ``tenant``)."""
    rows = UsageDay.objects.filter(tenant__operator=operator, day__gte=start, day__lte=end)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    return rows.select_related("tenant").order_by("day", "tenant__slug", "tenant_id")


@dataclass(frozen=True)
class UsageTotals:
    start: date
    end: date
    tasks_submitted: int
    tasks_done: int
    tasks_failed: int
    steps_run: int
    compute_s: float
    messages_in: int
    messages_out: int
    effects_committed: int
    input_tokens: int
    output_tokens: int
    schema_bytes: int | None  # the latest measurement in the period (each storage figure)
    object_bytes: int | None
    volume_bytes: int | None
    collected_at: datetime | None  # when the newest row was written (None: never collected)


def usage_totals(*, tenant: Tenant, start: date, end: date) -> UsageTotals:
    rows = UsageDay.objects.filter(tenant=tenant, day__gte=start, day__lte=end)
    sums = rows.aggregate(**{name: Sum(name) for name in _SUMMED}, collected_at=Max("collected_at"))
    # Storage is measured all at once (today's row): the latest row that has any measurement has them all.
    measured = (rows.filter(Q(schema_bytes__isnull=False) | Q(object_bytes__isnull=False)
                            | Q(volume_bytes__isnull=False)).order_by("-day").values(*_STORAGE).first()) or {}
    return UsageTotals(start=start, end=end, collected_at=sums.pop("collected_at"),
                       schema_bytes=measured.get("schema_bytes"), object_bytes=measured.get("object_bytes"),
                       volume_bytes=measured.get("volume_bytes"), **{name: (sums[name] or 0) for name in _SUMMED})


# --- the plan's monthly limits (issue 37) ---------------------------------------------------------------------

def usage_month_tokens(*, tenant: Tenant, since: date) -> int:
    """Model tokens (in + out) of the month's collected days: what the bill says, up to one collection behind."""
    sums = UsageDay.objects.filter(tenant=tenant, day__gte=since).aggregate(i=Sum("input_tokens"),
                                                                            o=Sum("output_tokens"))
    return int(sums["i"] or 0) + int(sums["o"] or 0)


# --- the staff dashboard: the whole fleet ---------------------------------------------------------------------

def usage_fleet_by_day(*, start: date, end: date) -> list[dict[str, Any]]:
    """Every customer's usage summed per day (every operator's: staff only), oldest first."""
    rows = (UsageDay.objects.filter(day__gte=start, day__lte=end).values("day")
            .annotate(**{name: Sum(name) for name in _SUMMED}, **{name: Sum(name) for name in _STORAGE})
            .order_by("day"))
    return list(rows)


def usage_fleet_by_tenant(*, start: date, end: date) -> list[dict[str, Any]]:
    """Each customer's totals over the period (the staff usage screen's table), most tokens first; storage: the
    period's largest measurement (a day's figure is a measurement, not a count)."""
    rows = (UsageDay.objects.filter(day__gte=start, day__lte=end)
            .values("tenant_id", "tenant__slug", "tenant__operator__slug")
            .annotate(**{name: Sum(name) for name in _SUMMED}, **{name: Max(name) for name in _STORAGE})
            .order_by("-input_tokens", "tenant__slug"))
    return list(rows)
