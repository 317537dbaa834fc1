"""Every periodic (beat) job, declared once, and the one sync that writes them to django-celery-beat's tables.

Beat runs with ``django_celery_beat``'s ``DatabaseScheduler``, so the schedule lives in ``PeriodicTask`` rows.
``PERIODIC_JOBS`` below is the only place a job is declared; ``periodic_jobs_sync`` applies it after every
``migrate`` (and after the flush between transactional tests, which emits ``post_migrate`` too), so a deploy
that adds, changes or drops a job changes the rows with it. No migration registers a job any more.

Ownership: the rows this sync manages are named ``OWNED_PREFIX + job.name``. On those, the declaration wins
(task, interval, enabled) and a row whose job was dropped from the list is deleted. A row an operator adds by
hand with any other name is never touched. A job's interval is fixed here, or read from a setting
(the recovery sweep: ``RECOVERY_SWEEP_INTERVAL_S``); change the setting and the next ``migrate`` applies it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

__all__ = ["OWNED_PREFIX", "PERIODIC_JOBS", "PeriodicJob", "SyncResult", "periodic_jobs_sync"]

log = logging.getLogger(__name__)

OWNED_PREFIX = "cp: "


@dataclass(frozen=True)
class PeriodicJob:
    """One beat job: ``every_s`` is seconds, or the name of the setting that holds them."""

    name: str
    task: str
    every_s: float | str
    enabled: bool = True

    @property
    def row_name(self) -> str:
        return OWNED_PREFIX + self.name

    def interval_s(self) -> float:
        return float(getattr(settings, self.every_s)) if isinstance(self.every_s, str) else float(self.every_s)


PERIODIC_JOBS: tuple[PeriodicJob, ...] = (
    # The job kernel (controlplane/jobs): unfinished jobs of every kind that stopped moving (a killed worker).
    PeriodicJob("Resume stalled jobs", "controlplane.jobs.tasks.jobs_resume_stalled_task", 15),
    # Provisioning: stalled runs re-queued (a killed worker), dead and hung instances recovered, drift repaired.
    PeriodicJob("Recovery sweep: dead and hung instances", "provisioning.tasks.recovery_sweep_task",
                "RECOVERY_SWEEP_INTERVAL_S"),
    PeriodicJob("Drift check: missing or changed resources", "provisioning.tasks.drift_check_task", 60),
    PeriodicJob("Heartbeats: copy to PostgreSQL", "provisioning.tasks.heartbeats_sync_task", 15),
    # Each run backs up a slice of the fleet, spread over this interval (provisioning/databases/backups.py reads it).
    PeriodicJob("Schema backups", "provisioning.tasks.schema_backups_task", 600),
    PeriodicJob("Sleep: idle instances to sleep, waiting ones woken", "provisioning.tasks.instance_sleep_sweep_task",
                30),
    # Vault. Hourly expiry: archives expire by the day; a run is one listing of the archive prefix.
    PeriodicJob("Expire archives and shred retired data keys", "vault.tasks.archives_expire_and_shred_task", 3600),
    # A minute resolves a recovery's dip on the dashboard charts while 7 days stay ~10k rows per tenant.
    PeriodicJob("Dashboard: sample heartbeat age and fleet status", "dashboard.tasks.history_sample_task", 60),
    PeriodicJob("Inbox: deliver pending messages and tasks", "conversations.tasks.inbox_deliver_pending", 5),
    # Also where task outcomes and replies are read from the instances' tables (webhooks/runtime_events.py).
    PeriodicJob("Webhooks: queue deliveries that are due", "webhooks.tasks.webhooks_sweep_task", 60),
    # Usage per customer: yesterday's and today's UsageDay rows recounted from each instance's tables (usage/).
    PeriodicJob("Usage: collect from every instance", "usage.tasks.usage_collect_task", "USAGE_COLLECT_INTERVAL_S"),
    # Customers' schedules: due fire times become fire rows and go into the inbox (schedules/sweep.py).
    PeriodicJob("Schedules: fire what is due", "schedules.tasks.schedules_sweep_task", "SCHEDULES_SWEEP_INTERVAL_S"),
    # Connected accounts: access tokens expiring within OAUTH_REFRESH_SWEEP_WINDOW_S refreshed ahead of use.
    PeriodicJob("Connections: refresh tokens expiring soon", "connections.tasks.connections_refresh_sweep_task",
                "OAUTH_REFRESH_SWEEP_INTERVAL_S"),
)


@dataclass(frozen=True)
class SyncResult:
    created: list[str]
    updated: list[str]
    deleted: list[str]


def _interval(seconds: float) -> tuple[int, str]:
    """``IntervalSchedule`` holds whole units: whole seconds as seconds, anything finer in microseconds."""
    if seconds <= 0:
        raise ValueError(f"a periodic job's interval must be positive, not {seconds}")
    if float(seconds).is_integer():
        return int(seconds), "seconds"
    return max(1, round(seconds * 1_000_000)), "microseconds"


def periodic_jobs_sync(jobs: tuple[PeriodicJob, ...] = PERIODIC_JOBS) -> SyncResult:
    """Make the owned ``PeriodicTask`` rows say what ``jobs`` says; writes nothing when they already do.

    A row an older release registered under the job's bare name (its migrations did) is adopted and renamed,
    keeping its run history. Rows are saved and deleted one by one, through the model, so beat's change
    tracking (``PeriodicTasks``) notices and a running beat reloads its schedule.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    result = SyncResult([], [], [])
    with transaction.atomic():
        for job in jobs:
            every, period = _interval(job.interval_s())
            interval = IntervalSchedule.objects.filter(every=every, period=period).order_by("id").first()
            if interval is None:
                interval = IntervalSchedule.objects.create(every=every, period=period)
            row = (PeriodicTask.objects.select_for_update().filter(name=job.row_name).first()
                   or PeriodicTask.objects.select_for_update().filter(name=job.name, task=job.task).first())
            wanted: dict[str, Any] = {"name": job.row_name, "task": job.task, "interval_id": interval.pk,
                                      "crontab_id": None, "solar_id": None, "clocked_id": None, "enabled": job.enabled}
            if row is None:
                PeriodicTask.objects.create(**wanted)
                result.created.append(job.row_name)
            elif any(getattr(row, field) != value for field, value in wanted.items()):
                for field, value in wanted.items():
                    setattr(row, field, value)
                row.save()
                result.updated.append(job.row_name)
        declared = {job.row_name for job in jobs}
        for row in PeriodicTask.objects.filter(name__startswith=OWNED_PREFIX).exclude(name__in=declared):
            row.delete()
            result.deleted.append(row.name)
    if result.created or result.updated or result.deleted:
        log.info("periodic jobs: created %s, updated %s, deleted %s", result.created, result.updated, result.deleted)
    return result


def periodic_jobs_sync_after_migrate(sender: Any, **kwargs: Any) -> None:
    """``post_migrate`` receiver: the declared jobs exist as declared once the tables do."""
    if "django_celery_beat_periodictask" not in connection.introspection.table_names():
        return  # django_celery_beat migrated back to zero: nothing to write to
    periodic_jobs_sync()
