"""The OAuth redirect target: the provider sends the customer's browser here with ``code`` and ``state``.

Open to anyone by design (the browser carries no credential of ours): the single-use state, bound server-side to
the customer it was started for, is what authorizes it. The page says connected or not, and nothing else: no
token, no provider error text beyond its code.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import escape
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from controlplane.errors import ApplicationError

from .services import connection_complete

_PAGE = ("<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
         "<body><h1>{title}</h1><p>{text}</p></body></html>")


def _page(status: int, title: str, text: str) -> HttpResponse:
    response = HttpResponse(_PAGE.format(title=escape(title), text=escape(text)), status=status)
    response["Referrer-Policy"] = "no-referrer"  # the URL holds a code and a state
    return response


@never_cache
@require_GET
def oauth_callback(request: HttpRequest) -> HttpResponse:
    state, code, error = (request.GET.get("state", ""), request.GET.get("code", ""), request.GET.get("error", ""))
    # Built as the flow's start built its redirect URI on this host: a state started on another operator's host
    # does not match it, and is refused.
    served_at = request.build_absolute_uri(reverse("oauth-callback"))
    if error:
        # The customer declined (or the provider refused): the state is still claimed so it cannot be used again.
        try:
            connection_complete(state=state, code="", callback_url=served_at)
        except ApplicationError:
            pass
        return _page(400, "Not connected", f"The provider answered {error[:60]}. You can close this window and "
                                           "try again.")
    try:
        connection = connection_complete(state=state, code=code, callback_url=served_at)
    except ApplicationError as refused:
        return _page(refused.status_code if refused.status_code < 500 else 502, "Not connected", refused.detail)
    return _page(200, "Connected", f"Your {connection.provider} account is connected. You can close this window.")
