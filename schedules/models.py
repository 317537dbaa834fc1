"""A tenant's schedules and their fires. No business rules here: ``services`` and ``sweep`` write these rows,
``selectors`` reads them.

``ScheduleFire`` is the exactly-once record: one row per (schedule, fire time), enforced by a unique constraint,
so however many sweeps race (or repeat after a kill) a fire time exists once; its inbox item is keyed by the same
fire (``fire_idempotency_key``), so it is submitted once too.
"""

from __future__ import annotations

import uuid

from django.db import models

from conversations.models import InboxItem
from tenants.models import OperatorToken, Tenant

from .choices import CATCH_UP_MAX_DEFAULT, CatchUp, FireStatus, ScheduleStatus, TargetType


class Schedule(models.Model):
    """Cron (with a zone) or one moment (``at``); fires a task kind with params or a message into a thread."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=100)
    cron = models.CharField(max_length=100, blank=True)  # empty for a one-off
    timezone = models.CharField(max_length=64, default="UTC")
    at = models.DateTimeField(null=True, blank=True)  # one-off only
    target_type = models.CharField(max_length=10, choices=TargetType.choices)
    # task: {"kind", "params"}; message: {"thread", "content"}. Copied onto each fire when it is created.
    target = models.JSONField(default=dict)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST)
    catch_up_max = models.PositiveSmallIntegerField(default=CATCH_UP_MAX_DEFAULT)
    status = models.CharField(max_length=10, choices=ScheduleStatus.choices, default=ScheduleStatus.ACTIVE)
    # The cursor: the first fire time not yet materialised. Only the sweep (under a row lock) moves it forward;
    # creating, changing or resuming a schedule sets it to the next time after that moment.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    skipped_fires = models.PositiveIntegerField(default=0)  # missed times its catch-up policy dropped, in all
    created_by = models.ForeignKey(OperatorToken, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="schedules")
    # Set when the agent made it (``ctx.schedule``): the effect's idempotency key, unique per tenant, so the
    # instance asking again (a replayed step, an in-doubt effect resolved) gets this schedule back, never a second
    # one; and the task whose step asked for it.
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    created_by_task = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="schedule_name_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], condition=~models.Q(idempotency_key=""),
                                    name="schedule_key_unique_per_tenant"),
        ]
        indexes = [models.Index(fields=["status", "next_fire_at"], name="schedule_due")]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.name}"


class ScheduleFire(models.Model):
    """One fire time of one schedule, created once (unique) and dispatched once (its inbox item's key)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="fires")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="schedule_fires")
    fire_time = models.DateTimeField()
    target_type = models.CharField(max_length=10, choices=TargetType.choices)
    target = models.JSONField(default=dict)  # the schedule's target when this fire was created
    status = models.CharField(max_length=12, choices=FireStatus.choices, default=FireStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    inbox_item = models.ForeignKey(InboxItem, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="schedule_fires")
    created_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fire_time"]
        constraints = [models.UniqueConstraint(fields=["schedule", "fire_time"], name="schedule_fire_once")]
        indexes = [models.Index(fields=["status", "fire_time"], name="schedule_fire_status")]

    def __str__(self) -> str:
        return f"{self.schedule_id}@{self.fire_time.isoformat()}"

    @property
    def idempotency_key(self) -> str:
        return fire_idempotency_key(schedule_id=self.schedule_id, fire_time=self.fire_time)


def fire_idempotency_key(*, schedule_id: object, fire_time: object) -> str:
    """The inbox key of a fire: derived from (schedule, fire time) only, never from a row id or the payload, so
    any process that dispatches the fire again asks the inbox for the same item."""
    return f"schedule:{schedule_id}:{int(fire_time.timestamp())}"  # type: ignore[attr-defined]
