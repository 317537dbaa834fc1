"""The isolation page: every boundary between an instance and the rest, as ``check --deploy`` sees it."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from provisioning.fleet.posture import posture_as_data

from .views import staff_required


@require_GET
@staff_required
def isolation(request: HttpRequest) -> HttpResponse:
    lines = posture_as_data()
    worst = "fail" if any(x["status"] == "fail" for x in lines) else (
        "degraded" if any(x["status"] == "degraded" for x in lines) else "pass")
    return render(request, "dashboard/isolation.html", {"lines": lines, "worst": worst, "nav": "isolation"})
