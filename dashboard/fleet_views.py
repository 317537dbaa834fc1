"""History pictures: fleet status over time (its own page, and a small one on the overview), heartbeat age
and time to recover on each tenant page. Server-side SVG from ``charts``; the numbers from ``history``.

The tenant page and the overview get theirs through template tags (``history_charts``) so their views
stay as they are; everything here reads only.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from provisioning.fleet.sleep import wake_latency
from provisioning.models import InstanceWake
from tenants.models import Tenant

from . import history
from .charts import bar_chart, line_chart
from .views import staff_required

__all__ = ["fleet", "fleet_chart_context", "tenant_history_context", "sleep_context"]

RECENT_WAKES = 50


def fleet_chart_context(window: str | None) -> dict[str, Any]:
    """The fleet chart and what it was drawn from (the page's table shows the same samples)."""
    chosen = history.window_choose(window)
    data = history.fleet_history(window=chosen)
    chart = line_chart(data.times, data.series, start=data.start, end=data.end, stacked=True, gap_s=data.gap_s,
                       title=f"Instances by status, last {chosen}", chart_id="fleet-chart") if data.samples else None
    return {"window": chosen, "windows": list(history.WINDOWS), "fleet": data, "fleet_chart": chart}


def tenant_history_context(tenant: Tenant, window: str | None) -> dict[str, Any]:
    chosen = history.window_choose(window)
    beats = history.heartbeat_age_history(tenant, window=chosen)
    recoveries = history.recovery_times(tenant)
    return {
        "tenant": tenant, "window": chosen, "windows": list(history.WINDOWS), "beats": beats,
        "heartbeat_chart": line_chart(beats.times, beats.series, start=beats.start, end=beats.end, unit=" s",
                                      gap_s=beats.gap_s, title=f"Heartbeat age, last {chosen}",
                                      chart_id="heartbeat-chart") if beats.samples else None,
        "recovery_chart": bar_chart(recoveries, title=f"Time to resume, last {len(recoveries)} "
                                    f"recover{'y' if len(recoveries) == 1 else 'ies'}",
                                    unit=" s", chart_id="ttr-chart") if recoveries else None,
    }


def sleep_context() -> dict[str, Any]:
    """Scale to zero: instances asleep and awake now, p50/p95 wake latency of the recent wakes, the last few."""
    return {"sleep": wake_latency(recent=RECENT_WAKES), "idle_s": settings.INSTANCE_IDLE_SUSPEND_S,
            "wakes": list(InstanceWake.objects.select_related("tenant").order_by("-requested_at")[:10])}


@require_GET
@staff_required
def fleet(request: HttpRequest) -> HttpResponse:
    context = fleet_chart_context(request.GET.get("window"))
    labels = [name for name, _ in context["fleet"].series] or list(history.FLEET_LABELS[:1])
    return render(request, "dashboard/fleet.html", {**context, **sleep_context(), "labels": labels,
                                                    "rows": history.fleet_latest(labels), "nav": "fleet"})
