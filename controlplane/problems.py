"""RFC 7807 problem+json for every API error: our ApplicationError family and DRF's own."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .errors import ApplicationError, QuotaExceeded
from .hostpaths import scrub_host_paths, scrub_json

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
# Paths whose clients read JSON: even an unexpected error there is problem+json, never an HTML page.
API_PATH_PREFIXES = ("/api/", "/internal/")
# Relative references (RFC 7807 3.1), resolved against the API's host: each is a page this product serves
# (controlplane/problem_types.py), never a site that may not exist.
TYPE_BASE = "/problems/"
QUOTA_RETRY_AFTER_S = 3600

_DRF_TITLES = {
    400: ("invalid-input", "Invalid input"),
    401: ("unauthenticated", "Authentication required"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    406: ("not-acceptable", "Not acceptable"),
    413: ("payload-too-large", "Payload too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    429: ("throttled", "Too many requests"),
}


def problem_response(
    status_code: int, type_slug: str, title: str, detail: str, instance: str = "", **extra: Any
) -> Response:
    # An error's text is often an exception's: it may name a path on this host (an install, the object store).
    body = {"type": TYPE_BASE + type_slug, "title": title, "status": status_code,
            "detail": scrub_host_paths(str(detail)), **scrub_json(extra)}
    if instance:
        body["instance"] = instance
    return Response(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    if isinstance(detail, dict):
        out: list[dict[str, str]] = []
        for key, value in detail.items():
            out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(detail, list):
        out = []
        for item in detail:
            out += _flatten(item, prefix)
        return out
    return [{"field": prefix or "non_field_errors", "message": str(detail)}]


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    request = context.get("request")
    instance = request.path if request is not None else ""
    if isinstance(exc, ApplicationError):
        if exc.status_code >= 500:
            # Our own failure (vault, provisioning): the caller gets the message, the log gets it too.
            log.warning("%s %s: %s: %s", getattr(request, "method", "-"), instance, type(exc).__name__, exc.detail)
        problem = problem_response(exc.status_code, exc.type_slug, exc.title, exc.detail, instance, **exc.extra)
        if exc.status_code == status.HTTP_429_TOO_MANY_REQUESTS:
            # Every 429 says when to come back; a quota does not free itself, so that is a long while.
            wait = exc.retry_after_s if isinstance(exc, QuotaExceeded) else None
            problem["Retry-After"] = str(wait if wait is not None else QUOTA_RETRY_AFTER_S)
        return problem
    if isinstance(exc, RequestDataTooBig):
        # 413, what HTTP names this (RFC 9110 15.5.14): a client can tell "too big" from "malformed" by status.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return problem_response(413, "payload-too-large", "Payload too large",
                                f"the request body is larger than {limit} bytes", instance, max_bytes=limit)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = exception_handler(exc, context)
    if response is None:
        return None  # a real bug: Django's 500 handler (no details leak with DEBUG off)
    code = response.status_code
    type_slug, title = _DRF_TITLES.get(code, ("error", "Error"))
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        problem = problem_response(code, type_slug, title, detail, instance, errors=errors)
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        problem = problem_response(code, type_slug, title, str(detail), instance)
    for header in ("WWW-Authenticate", "Retry-After", "Allow"):
        if header in response:
            problem[header] = response[header]
    if code == status.HTTP_401_UNAUTHORIZED and "WWW-Authenticate" not in problem:
        problem["WWW-Authenticate"] = 'Bearer realm="api"'
    return problem


def server_error(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """``handler500``: an unexpected error on an API path is problem+json; other paths get Django's page.

    Django has already logged the traceback. The body names no detail of the error: it may hold anything.
    """
    if request.path.startswith(API_PATH_PREFIXES):
        body = {"type": TYPE_BASE + "internal-error", "title": "Internal server error", "status": 500,
                "detail": "the server failed to handle this request; the error is logged", "instance": request.path}
        return JsonResponse(body, status=500, content_type=PROBLEM_CONTENT_TYPE)
    from django.views.defaults import server_error as html_server_error

    return html_server_error(request)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: a path no route matches is problem+json on an API path, Django's page elsewhere.

    (Routes that match answer their own 404s through the DRF handler above.)
    """
    if request.path.startswith(API_PATH_PREFIXES):
        body = {"type": TYPE_BASE + "not-found", "title": "Not found", "status": 404,
                "detail": "no such endpoint; the API is described at /api/schema/", "instance": request.path}
        return JsonResponse(body, status=404, content_type=PROBLEM_CONTENT_TYPE)
    from django.views.defaults import page_not_found as html_page_not_found

    return html_page_not_found(request, exception)
