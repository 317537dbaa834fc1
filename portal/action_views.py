"""Customer actions on the portal: suspend, resume, restart, deprovision. One confirmation page each
(GET), then a POST with CSRF that calls one service.

Permission is the membership role (``portal.choices``): viewers cannot act at all, deprovisioning is for
admins. The customer is looked up through the host's operator, so another operator's customer is a 404
for every action and method. Suspend, resume and restart queue the slow part (stopping at a step
boundary, starting) to a Celery worker and return at once; the customer page follows the status live.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from controlplane.errors import ApplicationError
from provisioning.fleet.actions import RESTARTABLE, instance_restart_request, tenant_resume, tenant_suspend
from provisioning.workflows.onboarding import tenant_deprovision
from tenants.choices import TenantStatus
from tenants.forms import DeprovisionForm
from tenants.models import Tenant

from .choices import ACTING_ROLES, DEPROVISION_ROLES
from .forms import SuspendForm
from .views import _actor, _customer, member_required

__all__ = ["CustomerAction", "ACTIONS", "available_actions", "customer_action"]


@dataclass(frozen=True)
class CustomerAction:
    name: str
    roles: frozenset[str]
    title: str
    explain: str
    button: str
    danger: bool
    allowed_from: tuple[str, ...]  # tenant statuses in which the button is offered
    perform: Callable[[HttpRequest, Tenant, dict[str, Any]], str]
    form: Callable[[Tenant, Any], forms.Form] | None = None


def _suspend(request: HttpRequest, tenant: Tenant, data: dict[str, Any]) -> str:
    tenant_suspend(tenant=tenant, actor=_actor(request), reason=data.get("reason", ""))
    return f"{tenant.name} is suspended; its agent is being stopped. Messages sent meanwhile wait in the inbox."


def _resume(request: HttpRequest, tenant: Tenant, data: dict[str, Any]) -> str:
    tenant_resume(tenant=tenant, actor=_actor(request))
    return f"{tenant.name} is resuming; its agent starts from where it left off."


def _restart(request: HttpRequest, tenant: Tenant, data: dict[str, Any]) -> str:
    instance_restart_request(tenant=tenant, actor=_actor(request))
    return f"Restart of {tenant.name}'s agent queued; it finishes its current step first. This page follows it."


def _deprovision(request: HttpRequest, tenant: Tenant, data: dict[str, Any]) -> str:
    tenant_deprovision(tenant=tenant, actor=_actor(request))
    return f"Deprovisioning {tenant.name}: its data is archived, then every resource is removed."


_DEPROVISIONABLE = tuple(s for s in TenantStatus.values if s not in (TenantStatus.DEPROVISIONING, TenantStatus.DELETED))

ACTIONS: dict[str, CustomerAction] = {a.name: a for a in (
    CustomerAction("suspend", ACTING_ROLES, "Suspend {name}",
                   "The agent is stopped at its next step boundary. Its data, files and credentials are kept, and "
                   "messages sent while it is suspended wait in the inbox until it is resumed.",
                   "Yes, suspend", True, (TenantStatus.READY, TenantStatus.DEGRADED), _suspend,
                   lambda tenant, data: SuspendForm(data)),
    CustomerAction("resume", ACTING_ROLES, "Resume {name}",
                   "The agent is started again and reads back its conversations and its last checkpoint before "
                   "doing anything new.", "Yes, resume", False, (TenantStatus.SUSPENDED,), _resume),
    CustomerAction("restart", ACTING_ROLES, "Restart {name}'s agent",
                   "The agent finishes its current step, stops, and starts again from its last checkpoint. "
                   "A planned restart is not counted as a recovery.", "Yes, restart", False,
                   tuple(RESTARTABLE), _restart),
    CustomerAction("deprovision", DEPROVISION_ROLES, "Deprovision {name}",
                   "The customer's database is archived (encrypted) and then its agent, files, storage and keys "
                   "are deleted. This cannot be undone.", "Deprovision", True,
                   _DEPROVISIONABLE, _deprovision,
                   lambda tenant, data: DeprovisionForm(data, expected_slug=tenant.slug)),
)}


def available_actions(tenant: Tenant, membership: Any) -> list[CustomerAction]:
    """The buttons to show: what this member's role allows and the customer's status permits."""
    role = getattr(membership, "role", None)
    return [a for a in ACTIONS.values() if role in a.roles and tenant.status in a.allowed_from]


def _confirm_page(request: HttpRequest, tenant: Tenant, spec: CustomerAction, form: forms.Form | None,
                  status: int = 200) -> HttpResponse:
    return render(request, "portal/customer_action.html", {
        "tenant": tenant, "action": spec, "title": spec.title.format(name=tenant.name), "form": form,
        "cancel": reverse("portal:customer", args=[tenant.pk]), "nav": "customers",
    }, status=status)


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def customer_action(request: HttpRequest, tenant_id: uuid.UUID, action: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)  # first: another operator's customer is a 404, whatever the action
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404("no such action")
    if request.membership.role not in spec.roles:
        raise PermissionDenied(f"{action} needs the admin role")
    if request.method == "GET":
        return _confirm_page(request, tenant, spec, spec.form(tenant, None) if spec.form else None)
    form = spec.form(tenant, request.POST) if spec.form else None
    if form is not None and not form.is_valid():
        return _confirm_page(request, tenant, spec, form, status=400)
    try:
        messages.success(request, spec.perform(request, tenant, form.cleaned_data if form is not None else {}))
    except ApplicationError as exc:
        messages.error(request, f"{spec.title.format(name=tenant.name)}: not done. {exc.detail}")
    return redirect("portal:customer", tenant_id=tenant.pk)
