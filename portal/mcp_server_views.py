"""The customer page's MCP servers: add one of the customer's own, remove one (the confirmation page, then POST).
The operator's servers for every customer are listed here but managed through the API (``/api/v1/mcp-servers``).
Thin: ``mcp_servers.services`` checks and audits."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.errors import ApplicationError, NotFound
from mcp_servers.selectors import mcp_server_get
from mcp_servers.services import mcp_server_create, mcp_server_delete

from .forms import CredentialForm, McpServerForm
from .views import _actor, _customer, _customer_page_context, member_required

__all__ = ["mcp_server_add", "mcp_server_remove"]


@require_POST
@member_required(act=True)
def mcp_server_add(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    form = McpServerForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            row = mcp_server_create(operator=tenant.operator, tenant=tenant, actor=_actor(request), name=data["name"],
                                    url=data["url"], credential=data["credential"], connection=data["connection"],
                                    trust_annotations=data["trust_annotations"], allowed_tools=data["allowed_tools"])
        except ApplicationError as exc:
            field = exc.extra.get("field")
            form.add_error(field if field in form.fields else None, exc.detail)
        else:
            messages.success(request, f"MCP server {row.name} added; the agent's next task can call it.")
            return redirect("portal:customer", tenant_id=tenant.pk)
    return render(request, "portal/customer.html", {
        **_customer_page_context(request, tenant), "credential_form": CredentialForm(), "mcp_server_form": form,
    }, status=400)


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def mcp_server_remove(request: HttpRequest, tenant_id: uuid.UUID, server_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    # Only the customer's own entries: one of yours for every customer is 404 here (remove it through the API).
    try:
        row = mcp_server_get(operator=tenant.operator, server_id=server_id, tenant=tenant)
    except NotFound:
        raise Http404("MCP server not found") from None
    if request.method == "POST":
        try:
            mcp_server_delete(operator=tenant.operator, tenant=tenant, server_id=row.pk, actor=_actor(request))
            messages.success(request, f"MCP server {row.name} removed; the agent's next task no longer gets it.")
        except ApplicationError as exc:
            messages.error(request, exc.detail)
        return redirect("portal:customer", tenant_id=tenant.pk)
    return render(request, "portal/confirm.html", {
        "title": f"Remove MCP server {row.name}?", "nav": "customers",
        "explain": f"{tenant.name}'s agent will no longer be able to call {row.name} ({row.url}).",
        "button": "Yes, remove", "cancel": reverse("portal:customer", args=[tenant.pk]),
    })
