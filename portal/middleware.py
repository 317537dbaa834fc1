"""Resolve the operator from the request's host name and serve its portal there.

Control-plane hosts (``CONTROL_PLANE_HOSTS``) get the normal URL map (staff dashboard, API,
admin). Any other host is looked up in ``Operator.domains``: a match gets the portal's URL map
with ``request.operator`` set; an unknown host gets 404 for every path, so the portal never
guesses an operator and operator hosts never expose the staff dashboard or the admin.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.http.request import split_domain_port, validate_host

from tenants.models import Operator

__all__ = ["OperatorHostMiddleware", "operator_for_host"]


def operator_for_host(host: str) -> Operator | None:
    host = host.lower().rstrip(".")
    if not host:
        return None
    return Operator.objects.filter(domains__contains=[host]).first()


class OperatorHostMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        host, _ = split_domain_port(request.get_host())
        request.operator = None
        if not validate_host(host, settings.CONTROL_PLANE_HOSTS):
            operator = operator_for_host(host)
            if operator is None:
                return HttpResponseNotFound(b"Not found", content_type="text/plain")
            request.operator = operator
            request.urlconf = "portal.urls"
        return self.get_response(request)
