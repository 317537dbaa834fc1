"""Named statuses of branding submissions, rollout jobs and per-instance deployments."""

from __future__ import annotations

from django.db import models


class RevisionStatus(models.TextChoices):
    PENDING = "pending"  # queued for validation by the Celery job
    REJECTED = "rejected"  # validation found errors; nothing was published
    PUBLISHED = "published"  # rendered into a theme that is now current


class RolloutStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # finished, but some instances could not be updated (retry re-runs only those)
    SUPERSEDED = "superseded"  # a newer theme became current before this rollout finished


ACTIVE_ROLLOUT_STATUSES = (RolloutStatus.PENDING, RolloutStatus.RUNNING)
