"""The customer page's schedules: create one, pause and resume it, delete it (confirmed). Members who may act do
this; viewers see the list only. Each change is the schedules service's (validated and audited there, acted by the
member "via the portal"); an error comes back on the form, next to the field it names."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.errors import ApplicationError, NotFound
from schedules.cron import CronInvalid, zone_validate
from schedules.screens import schedule_pause_post
from schedules.selectors import schedule_get
from schedules.services import schedule_create, schedule_delete
from tenants.models import Tenant

from .forms import CredentialForm, ScheduleForm
from .views import _actor, _customer, _customer_page_context, member_required

__all__ = ["schedule_add", "schedule_change", "schedule_delete_view"]

# The service names the API's fields; the form has its own.
_FORM_FIELD = {"task": "kind", "task.kind": "kind", "task.params": "params", "message.thread": "thread",
               "message.content": "content", "catch_up_max": "catch_up"}


def _back(tenant: Tenant) -> str:
    return reverse("portal:customer", args=[tenant.pk]) + "#schedules"


def _schedule(tenant: Tenant, schedule_id: object) -> Any:
    try:
        return schedule_get(tenant=tenant, schedule_id=schedule_id)
    except NotFound:
        raise Http404("schedule not found") from None


def _create(request: HttpRequest, tenant: Tenant, form: ScheduleForm) -> None:
    data = form.cleaned_data
    at = data["at"]
    if at is not None:  # the moment the member typed, in the zone the member chose
        try:
            at = timezone.make_naive(at).replace(tzinfo=zone_validate(data["timezone"]))
        except CronInvalid as exc:
            raise ApplicationError(str(exc), extra={"field": "timezone"}) from None
    task = {"kind": data["kind"], "params": data["params"]} if data["kind"] else None
    message = ({"thread": data["thread"], "content": data["content"]}
               if data["thread"] or data["content"] else None)
    schedule_create(tenant=tenant, name=data["name"], cron=data["cron"] or None, timezone_name=data["timezone"],
                    at=at, task=task, message=message, catch_up=data["catch_up"], actor=_actor(request))


@require_POST
@member_required(act=True)
def schedule_add(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    form = ScheduleForm(request.POST)
    if form.is_valid():
        try:
            _create(request, tenant, form)
        except ApplicationError as refused:
            field = refused.extra.get("field")
            field = _FORM_FIELD.get(str(field), field)
            said = refused.extra.get("errors") or [{}]
            form.add_error(field if field in form.fields else None, said[0].get("message") or refused.detail)
        else:
            messages.success(request, f"Schedule {form.cleaned_data['name']} created.")
            return redirect(_back(tenant))
    return render(request, "portal/customer.html", {
        **_customer_page_context(request, tenant), "credential_form": CredentialForm(), "schedule_form": form,
    }, status=400)


@require_POST
@member_required(act=True)
def schedule_change(request: HttpRequest, tenant_id: uuid.UUID, schedule_id: uuid.UUID, action: str) -> HttpResponse:
    """Pause (fire times that pass are never run) or resume (from the next fire time after now)."""
    tenant = _customer(request, tenant_id)
    return schedule_pause_post(request, tenant=tenant, schedule_id=schedule_id, action=action, actor=_actor(request),
                               back_url=_back(tenant))


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def schedule_delete_view(request: HttpRequest, tenant_id: uuid.UUID, schedule_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    schedule = _schedule(tenant, schedule_id)
    if request.method == "POST":
        schedule_delete(schedule=schedule, actor=_actor(request))
        messages.success(request, f"Schedule {schedule.name} deleted.")
        return redirect(_back(tenant))
    return render(request, "portal/confirm.html", {
        "title": f"Delete schedule {schedule.name}?", "nav": "customers",
        "explain": f"{tenant.name}'s agent will no longer be started by it, and its fire history goes with it. "
                   "A fire already handed to the agent still runs.",
        "button": "Yes, delete", "cancel": _back(tenant),
    })
