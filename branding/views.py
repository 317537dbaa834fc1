"""Serve sanitized logos by content hash, on the control plane and on every operator host.

Logos are public by nature (every visitor of a portal sees them) and addressed by a SHA-256 of
their content, so a URL cannot be guessed. A strict CSP and ``sandbox`` keep even an SVG opened
directly from running anything.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from .models import BrandingAsset


@require_GET
def asset(request: HttpRequest, sha256: str) -> HttpResponse:
    found = BrandingAsset.objects.filter(sha256=sha256).first()
    if found is None:
        raise Http404("no such asset")
    response = HttpResponse(bytes(found.data), content_type=found.content_type)
    response["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response
