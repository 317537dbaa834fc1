"""The history pictures as includes, so the overview and tenant pages draw them without their views changing."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("dashboard/_tenant_history.html", takes_context=True)
def tenant_history(context: dict[str, Any], tenant: Any) -> dict[str, Any]:
    """Heartbeat age over ``?history=`` (1h, 6h, 24h, 7d) and time to resume per recovery."""
    from dashboard.fleet_views import tenant_history_context  # views import templates' libraries lazily too

    request = context.get("request")
    return tenant_history_context(tenant, request.GET.get("history") if request is not None else None)


@register.inclusion_tag("dashboard/_fleet_chart.html")
def fleet_chart(window: str = "24h") -> dict[str, Any]:
    from dashboard.fleet_views import fleet_chart_context

    return {**fleet_chart_context(window), "compact": True}
