"""The incident banner every staff page carries (``dashboard/base.html``): one sentence naming what of the control
plane is stale or down and since when, from ``process_health_cached`` (a few seconds old at most, so a page render
never waits for a broker probe)."""

from __future__ import annotations

from typing import Any

from django import template

from dashboard.process_health import process_health_cached

register = template.Library()


@register.inclusion_tag("dashboard/_incident_banner.html")
def incident_banner() -> dict[str, Any]:
    return {"down": [r for r in process_health_cached() if not r.ok]}
