"""Named statuses, policies and targets of schedules. No logic here."""

from __future__ import annotations

from django.db import models


class ScheduleStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"  # fire times that pass while paused are never run (resume starts from the next one)
    COMPLETED = "completed"  # a one-off ("at") schedule whose time has been handled


class CatchUp(models.TextChoices):
    """What a schedule does with fire times that passed while nothing could fire them (beat or workers down)."""

    SKIP = "skip"  # missed times are dropped; the next fire is the next time due
    LATEST = "latest"  # the latest missed time fires once
    ALL = "all"  # every missed time fires, the most recent `catch_up_max` of them


class TargetType(models.TextChoices):
    TASK = "task"
    MESSAGE = "message"


class FireStatus(models.TextChoices):
    PENDING = "pending"  # committed, not yet in the inbox (the next sweep dispatches it)
    DISPATCHED = "dispatched"  # its inbox item exists; the inbox delivers it (and wakes the instance)
    FAILED = "failed"  # the inbox refused it for good (quota, tenant being deleted): `error` says why


CATCH_UP_MAX_LIMIT = 100
CATCH_UP_MAX_DEFAULT = 10
NEXT_FIRES_SHOWN = 5
