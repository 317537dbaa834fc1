"""Public events across every operator and tenant: what the events API and webhooks told operators, and when.

Reads only (``webhooks.selectors.event_list_all``); staff see every operator's events, nothing is changed here.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from tenants.models import Operator
from webhooks.choices import EVENT_TYPE_PREFIXES, EventType
from webhooks.selectors import event_list_all

from .views import staff_required

# What the type filter offers: each prefix as ``<prefix>.*``, then each exact type. Anything else in the query
# string is ignored, as the recoveries page ignores an unknown reason.
TYPE_CHOICES: tuple[str, ...] = (*(f"{p}.*" for p in sorted(EVENT_TYPE_PREFIXES)), *sorted(EventType.values))


@require_GET
@staff_required
def events(request: HttpRequest) -> HttpResponse:
    type_ = request.GET.get("type", "")
    type_ = type_ if type_ in TYPE_CHOICES else ""
    operator = request.GET.get("operator", "")[:63]
    tenant = request.GET.get("tenant", "")[:63]
    qs = event_list_all(type=type_ or None, operator_slug=operator or None, tenant_slug=tenant or None)
    page = Paginator(qs, settings.DASHBOARD_PAGE_SIZE).get_page(request.GET.get("page"))
    kept = {k: v for k, v in {"type": type_, "operator": operator, "tenant": tenant}.items() if v}
    return render(request, "dashboard/events.html", {
        "page": page, "type": type_, "operator": operator, "tenant": tenant, "types": TYPE_CHOICES,
        "operators": Operator.objects.order_by("slug").values_list("slug", flat=True),
        "query": urlencode(kept) + "&" if kept else "", "nav": "events",
    })
