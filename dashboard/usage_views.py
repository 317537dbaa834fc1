"""Usage on the staff dashboard (issue 37): the fleet's usage per day and per customer, and one customer's days.

Reads ``UsageDay`` through ``usage.selectors`` only (the numbers the usage API, its CSV and the portal give) and
draws with ``charts.bar_chart``. Staff see every operator's customers; nothing here writes.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from controlplane.errors import ValidationFailed
from conversations.monthly_limits import monthly_limits
from tenants.models import Tenant
from usage.selectors import (
    usage_fleet_by_day,
    usage_fleet_by_tenant,
    usage_period,
    usage_rows,
    usage_totals,
)

from .charts import bar_chart
from .views import staff_required

__all__ = ["usage", "tenant_usage"]


def _period(request: HttpRequest) -> tuple[date, date, str]:
    """``?from=&to=`` (ISO days, UTC); anything unreadable falls back to this month so far, and says so."""
    try:
        start = date.fromisoformat(request.GET["from"]) if request.GET.get("from") else None
        end = date.fromisoformat(request.GET["to"]) if request.GET.get("to") else None
        return (*usage_period(start, end), "")
    except (ValueError, ValidationFailed) as exc:
        return (*usage_period(None, None), f"period not understood ({exc}): this month so far")


def _tokens_chart(days: list[tuple[date, int]], chart_id: str) -> Any:
    """A bar per day, oldest first: (day, tokens in + out)."""
    points = [(f"{day:%b} {day.day}", float(tokens)) for day, tokens in days]
    return bar_chart(points, title="Model tokens per day (in + out)", chart_id=chart_id) if points else None


@require_GET
@staff_required
def usage(request: HttpRequest) -> HttpResponse:
    start, end, note = _period(request)
    days = usage_fleet_by_day(start=start, end=end)
    totals = {name: sum((d[name] or 0) for d in days) for name in (
        "tasks_submitted", "tasks_done", "tasks_failed", "steps_run", "compute_s", "messages_in", "messages_out",
        "effects_committed", "input_tokens", "output_tokens")}
    context: dict[str, Any] = {
        "nav": "usage", "start": start, "end": end, "note": note, "days": days, "totals": totals,
        "tenants": usage_fleet_by_tenant(start=start, end=end), "chart": _tokens_chart(
            [(d["day"], (d["input_tokens"] or 0) + (d["output_tokens"] or 0)) for d in days], "usage-fleet-chart")}
    return render(request, "dashboard/usage.html", context)


@require_GET
@staff_required
def tenant_usage(request: HttpRequest, tenant_id: Any) -> HttpResponse:
    tenant = get_object_or_404(Tenant.objects.select_related("operator", "plan"), pk=tenant_id)
    start, end, note = _period(request)
    rows = list(usage_rows(operator=tenant.operator, start=start, end=end, tenant=tenant))
    context: dict[str, Any] = {
        "nav": "tenants", "tenant": tenant, "start": start, "end": end, "note": note, "rows": rows,
        "totals": usage_totals(tenant=tenant, start=start, end=end), "limits": monthly_limits(tenant=tenant),
        "chart": _tokens_chart([(r.day, r.input_tokens + r.output_tokens) for r in rows], "usage-tenant-chart")}
    return render(request, "dashboard/usage_tenant.html", context)
