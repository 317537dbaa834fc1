"""The trace waterfall as a tag, so the shared task template (`templates/ui/agent/_task.html`) draws it on the
dashboard and in the portal alike: the portal reaches this library through Django's template registry, never by
importing the dashboard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import template
from django.utils.safestring import SafeString

from dashboard.charts import waterfall_chart

register = template.Library()


@register.simple_tag
def trace_waterfall(rows: Sequence[Mapping[str, Any]]) -> SafeString:
    """The spans of ``conversations.screens.trace_rows`` as a waterfall."""
    return waterfall_chart(rows, title="Trace", chart_id="trace")
