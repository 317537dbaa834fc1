"""Staff on a tenant's schedules: pause one that misbehaves (a runaway or failing fire every few seconds) and resume
it, as a blocked task can be cancelled. Needs ``dashboard.pause_schedule``; the change is the schedules service's,
audited with the staff user as actor. Creating, changing and deleting stay with the operator and the customer
(portal, API) and the agent (``ctx.schedule``): the schedule is their work, not the platform's."""

from __future__ import annotations

import uuid

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from schedules.screens import schedule_pause_post

from .views import _actor, _tenant, staff_required

__all__ = ["PAUSE", "schedule_change"]

PAUSE = "dashboard.pause_schedule"


@require_POST
@staff_required
def schedule_change(request: HttpRequest, tenant_id: uuid.UUID, schedule_id: uuid.UUID, action: str) -> HttpResponse:
    """Pause or resume one schedule of the tenant (``action``: ``pause`` or ``resume``)."""
    if not request.user.has_perm(PAUSE):
        raise PermissionDenied(f"needs {PAUSE}")
    tenant = _tenant(tenant_id)
    return schedule_pause_post(request, tenant=tenant, schedule_id=schedule_id, action=action, actor=_actor(request),
                               back_url=reverse("dashboard:tenant", args=[tenant.pk]) + "#schedules")
