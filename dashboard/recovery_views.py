"""Recoveries across every tenant: what died or hung, when, how long recovery took and what it resumed."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from provisioning.choices import RecoveryOutcome, RecoveryReason
from provisioning.models import RecoveryEvent

from .charts import bar_chart
from .views import staff_required


@require_GET
@staff_required
def recoveries(request: HttpRequest) -> HttpResponse:
    reason = request.GET.get("reason", "")
    outcome = request.GET.get("outcome", "")
    qs = RecoveryEvent.objects.select_related("tenant", "tenant__operator").order_by("-detected_at", "-id")
    if reason in RecoveryReason.values:
        qs = qs.filter(reason=reason)
    if outcome in RecoveryOutcome.values:
        qs = qs.filter(outcome=outcome)
    page = Paginator(qs, settings.DASHBOARD_PAGE_SIZE).get_page(request.GET.get("page"))
    for event in page:
        event.took_s = ((event.resumed_at - event.detected_at).total_seconds()
                        if event.resumed_at else None)
    shown = list(reversed(list(page)))  # oldest first, left to right
    # The time first: under a bar only its start fits, and the tooltip has the whole label.
    chart = bar_chart([(f"{e.detected_at:%H:%M} {e.tenant.slug} ({e.detected_at:%b} {e.detected_at.day})", e.took_s)
                       for e in shown],
                      title="Time to resume per recovery on this page", unit=" s") if shown else None
    kept = {k: v for k, v in {"reason": reason, "outcome": outcome}.items() if v}
    return render(request, "dashboard/recoveries.html", {
        "page": page, "reason": reason, "outcome": outcome, "reasons": RecoveryReason.values,
        "outcomes": RecoveryOutcome.values, "chart": chart, "query": urlencode(kept) + "&" if kept else "",
        "nav": "recoveries",
    })
