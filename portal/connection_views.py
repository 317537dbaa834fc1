"""The customer page's connected accounts: the list (metadata only, never a token), the Connect button, which
starts the OAuth flow for the customer and sends the browser to the provider (it sends it back to
``/oauth/callback`` on this same operator host, ``portal.urls`` routes it, which records the connection), and
Disconnect, which asks for confirmation (GET) and then disconnects (POST with the CSRF token): revoked at the
provider where it can be, tokens deleted (``connections.services.connection_disconnect``)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from connections.choices import ConnectionStatus
from connections.selectors import connection_get, connection_list, oauth_client_by_provider, oauth_client_list
from connections.services import connection_disconnect, connection_start
from controlplane.errors import ApplicationError, NotFound
from controlplane.security import policy_with_form_action
from tenants.models import Tenant

from .views import _actor, _customer, member_required

__all__ = ["connect_forms_allowed", "connection_disconnect_view", "connection_start_view", "connections_panel"]

# What a disconnect's outcome at the provider means to the person who pressed the button.
_REVOCATION_SAID = {
    "revoked": "revoked at the provider and its tokens deleted",
    "unsupported": "its tokens deleted here; the provider has no revocation endpoint, so they stay valid there "
                   "until they expire or the customer removes the app at the provider",
    "failed": "its tokens deleted here; the provider did not confirm the revocation, so they may stay valid "
              "there until they expire",
    "nothing_left": "it was already disconnected",
}


def connections_panel(tenant: Tenant) -> dict[str, Any]:
    """What the customer page shows: the newest connection per provider first (older ones are history), the
    providers the operator can connect, and which ones need the customer (the banner)."""
    rows = list(connection_list(tenant=tenant)[:50])
    newest: dict[str, Any] = {}
    for row in rows:
        newest.setdefault(row.provider, row)
    broken = sorted(p for p, row in newest.items() if row.status == ConnectionStatus.NEEDS_REAUTH)
    return {"connections": rows, "connection_providers": [c.provider for c in oauth_client_list(
        operator=tenant.operator)], "connections_need_reauth": broken}


def connect_forms_allowed(response: HttpResponse, tenant: Tenant) -> HttpResponse:
    """The customer page's Connect forms are answered by a redirect to the provider's authorization endpoint; the
    page's ``form-action`` must name those origins (only the operator's own providers'), or Chromium and Firefox
    stop the redirect and the button does nothing."""
    origins = []
    for client in oauth_client_list(operator=tenant.operator):
        url = urlsplit(client.authorization_endpoint)
        if url.scheme in ("http", "https") and url.netloc:
            origins.append(f"{url.scheme}://{url.netloc}")
    if origins and settings.CONTENT_SECURITY_POLICY and "Content-Security-Policy" not in response:
        response["Content-Security-Policy"] = policy_with_form_action(settings.CONTENT_SECURITY_POLICY, origins)
    return response


@require_POST
@member_required(act=True)
def connection_start_view(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    provider = request.POST.get("provider", "")
    try:
        client = oauth_client_by_provider(operator=request.operator, provider=provider)
        started = connection_start(tenant=tenant, oauth_client=client, actor=_actor(request),
                                   redirect_uri=request.build_absolute_uri(reverse("oauth-callback")))
    except ApplicationError as refused:
        messages.error(request, refused.detail)
        return redirect("portal:customer", tenant_id=tenant.pk)
    response = HttpResponseRedirect(started.authorization_url)
    response["Cache-Control"] = "no-store"  # the URL carries the flow's state
    response["Referrer-Policy"] = "no-referrer"
    return response


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def connection_disconnect_view(request: HttpRequest, tenant_id: uuid.UUID, connection_id: uuid.UUID) -> HttpResponse:
    """GET: the confirmation page; POST (its form, CSRF-checked): disconnect. Another operator's customer or
    connection is a 404, as everywhere in the portal."""
    tenant = _customer(request, tenant_id)
    try:
        connection = connection_get(tenant=tenant, connection_id=connection_id)
    except NotFound:
        raise Http404("connection not found") from None
    if request.method == "POST":
        try:
            done = connection_disconnect(tenant=tenant, connection_id=connection.pk, actor=_actor(request))
            messages.success(request, f"The {connection.provider} connection is disconnected: "
                                      f"{_REVOCATION_SAID.get(done.provider_revocation, done.provider_revocation)}.")
        except ApplicationError as refused:
            messages.error(request, refused.detail)
        return redirect("portal:customer", tenant_id=tenant.pk)
    account = f" ({connection.account_id})" if connection.account_id else ""
    return render(request, "portal/confirm.html", {
        "title": f"Disconnect {connection.provider}{account}?", "nav": "customers",
        "explain": f"{tenant.name}'s agent will no longer get tokens for this {connection.provider} account. Its "
                   "tokens are revoked at the provider where it allows, then deleted; tasks that need it wait "
                   "until the customer connects again.",
        "button": "Yes, disconnect", "cancel": reverse("portal:customer", args=[tenant.pk]),
    })
