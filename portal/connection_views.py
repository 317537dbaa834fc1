"""The customer page's connected accounts: the list (metadata only, never a token) and the Connect button, which
starts the OAuth flow for the customer and sends the browser to the provider. The provider sends it back to
``/oauth/callback`` on this same operator host (``portal.urls`` routes it), which records the connection."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from connections.choices import ConnectionStatus
from connections.selectors import connection_list, oauth_client_by_provider, oauth_client_list
from connections.services import connection_start
from controlplane.errors import ApplicationError
from tenants.models import Tenant

from .views import _actor, _customer, member_required

__all__ = ["connection_start_view", "connections_panel"]


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


@require_POST
@member_required(act=True)
def connection_start_view(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    provider = request.POST.get("provider", "")
    try:
        client = oauth_client_by_provider(operator=request.operator, provider=provider)  # type: ignore[attr-defined]
        started = connection_start(tenant=tenant, oauth_client=client, actor=_actor(request),
                                   redirect_uri=request.build_absolute_uri(reverse("oauth-callback")))
    except ApplicationError as refused:
        messages.error(request, refused.detail)
        return redirect("portal:customer", tenant_id=tenant.pk)
    response = HttpResponseRedirect(started.authorization_url)
    response["Cache-Control"] = "no-store"  # the URL carries the flow's state
    response["Referrer-Policy"] = "no-referrer"
    return response
