"""What the screens show of a customer's schedules (the portal's customer page, where they are also created and
changed; the staff dashboard's tenant page, where staff may pause and resume them): plain values, computed here so no
screen reaches into the model or the cron arithmetic, and the one Pause/Resume button both screens post to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect

from controlplane.errors import ApplicationError, NotFound
from tenants.actors import Actor
from tenants.models import Tenant

from .choices import ScheduleStatus, TargetType
from .selectors import schedule_get, schedule_list, schedule_next_fires
from .services import schedule_update

__all__ = ["ScheduleRow", "customer_schedules", "schedule_pause_post"]

NEXT_FIRES_ON_SCREEN = 3


@dataclass(frozen=True)
class ScheduleRow:
    id: str
    name: str
    when: str  # "0 8 * * * (Europe/Paris)" or "once at ..." (UTC)
    does: str  # "task reconcile" or "message into support-42"
    status: str
    next_fires: tuple[datetime, ...]
    last_fire_at: datetime | None
    skipped_fires: int
    catch_up: str
    made_by: str  # "agent task 1a2b3c4d" for a schedule the agent made with ctx.schedule, else ""

    @property
    def paused(self) -> bool:
        return self.status == ScheduleStatus.PAUSED


def customer_schedules(tenant: Tenant) -> list[ScheduleRow]:
    rows = []
    for schedule in schedule_list(tenant=tenant):
        if schedule.cron:
            when = f"{schedule.cron} ({schedule.timezone})"
        else:
            when = f"once at {schedule.at:%Y-%m-%d %H:%M:%S} UTC" if schedule.at else "once"
        does = (f"task {schedule.target.get('kind', '')}" if schedule.target_type == TargetType.TASK
                else f"message into {schedule.target.get('thread', '')}")
        rows.append(ScheduleRow(id=str(schedule.pk), name=schedule.name, when=when, does=does, status=schedule.status,
                                next_fires=tuple(schedule_next_fires(schedule, count=NEXT_FIRES_ON_SCREEN)),
                                last_fire_at=schedule.last_fire_at, skipped_fires=schedule.skipped_fires,
                                catch_up=schedule.catch_up, made_by=(f"agent task {schedule.created_by_task[:8]}"
                                                                     if schedule.created_by_task else "")))
    return rows


def schedule_pause_post(request: HttpRequest, *, tenant: Tenant, schedule_id: object, action: str, actor: Actor,
                        back_url: str) -> HttpResponse:
    """Pause (fire times that pass are never run) or resume (from the next fire time after now): the service the
    API's PATCH ``{"paused": ...}`` calls, audited there as the screen's actor. Another tenant's schedule is a 404."""
    if action not in ("pause", "resume"):
        raise Http404("no such action")
    try:
        schedule = schedule_get(tenant=tenant, schedule_id=schedule_id)
    except NotFound:
        raise Http404("schedule not found") from None
    try:
        schedule_update(schedule=schedule, changes={"paused": action == "pause"}, actor=actor)
    except ApplicationError as refused:
        messages.error(request, refused.detail)
    else:
        messages.success(request, f"Schedule {schedule.name} {'paused' if action == 'pause' else 'resumed'}.")
    return redirect(back_url)
