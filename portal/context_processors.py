"""The host operator's theme on every portal page (nothing on control-plane hosts)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from branding.selectors import portal_theme


def portal_context(request: HttpRequest) -> dict[str, Any]:
    operator = getattr(request, "operator", None)
    if operator is None:
        return {}
    return {"operator": operator, "theme": portal_theme(operator), "membership": getattr(request, "membership", None)}
