"""Release rollouts of every operator, for staff: a list and a read-only page per rollout (its live part polled
by htmx while it is active). Pausing, aborting and rolling back stay with the operator (portal, API)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from releases.choices import RolloutStatus
from releases.models import Rollout
from releases.screens import RUNTIME_AGENTS, count_rows, rollout_counts, rollout_is_active, rollout_items
from releases.selectors import rollout_list
from tenants.models import Operator

from .views import staff_required

__all__ = ["rollouts", "rollout", "rollout_live"]


@require_GET
@staff_required
def rollouts(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    operator = request.GET.get("operator", "")[:63]
    qs = rollout_list(operator=None)
    if status in RolloutStatus.values:
        qs = qs.filter(status=status)
    if operator:
        qs = qs.filter(operator__slug=operator)
    page = Paginator(qs, settings.DASHBOARD_PAGE_SIZE).get_page(request.GET.get("page"))
    counts = rollout_counts(page)
    for r in page:
        r.counts = count_rows(counts[r.pk], nonzero=True)
    kept = {k: v for k, v in {"status": status, "operator": operator}.items() if v}
    return render(request, "dashboard/rollouts.html", {
        "page": page, "status": status, "operator": operator, "statuses": RolloutStatus.choices,
        "operators": Operator.objects.order_by("slug").values_list("slug", flat=True),
        "query": urlencode(kept) + "&" if kept else "", "nav": "rollouts",
    })


def _rollout(rollout_id: uuid.UUID) -> Rollout:
    found = rollout_list(operator=None).filter(pk=rollout_id).first()
    if found is None:
        raise Http404("rollout not found")
    return found


def _live_context(rollout: Rollout) -> dict[str, Any]:
    counts = rollout_counts([rollout])[rollout.pk]
    return {"rollout": rollout, "counts": count_rows(counts), "total": sum(counts.values()),
            "items": rollout_items(rollout), "active": rollout_is_active(rollout), "runtime_agents": RUNTIME_AGENTS,
            "tenant_url": "dashboard:tenant", "noun": "tenant"}


@require_GET
@staff_required
def rollout(request: HttpRequest, rollout_id: uuid.UUID) -> HttpResponse:
    return render(request, "dashboard/rollout.html", {**_live_context(_rollout(rollout_id)), "nav": "rollouts"})


@require_GET
@staff_required
def rollout_live(request: HttpRequest, rollout_id: uuid.UUID) -> HttpResponse:
    return render(request, "dashboard/_rollout_live.html", _live_context(_rollout(rollout_id)))
