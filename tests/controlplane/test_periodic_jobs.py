"""Beat's jobs are declared once (controlplane/periodic.py) and the sync makes django-celery-beat's rows match."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

from controlplane.celery import app
from controlplane.periodic import OWNED_PREFIX, PERIODIC_JOBS, PeriodicJob, periodic_jobs_sync

pytestmark = pytest.mark.django_db

SWEEP_TASK = "provisioning.tasks.recovery_sweep_task"


def _row(task: str) -> PeriodicTask:
    return PeriodicTask.objects.select_related("interval").get(task=task)


def test_every_declared_job_is_a_registered_task_with_a_unique_name():
    app.loader.import_default_modules()
    assert [job.task for job in PERIODIC_JOBS if job.task not in app.tasks] == []
    assert len({job.name for job in PERIODIC_JOBS}) == len(PERIODIC_JOBS)


def test_migrate_leaves_exactly_the_declared_jobs_as_declared():
    # The test database was made by migrate, whose post_migrate ran the sync: nothing is left to do.
    assert periodic_jobs_sync().created == []
    owned = PeriodicTask.objects.filter(name__startswith=OWNED_PREFIX)
    assert sorted(owned.values_list("name", flat=True)) == sorted(job.row_name for job in PERIODIC_JOBS)
    for job in PERIODIC_JOBS:
        row = _row(job.task)
        assert (row.name, row.enabled, row.interval.every, row.interval.period) == (
            job.row_name, job.enabled, int(job.interval_s()), "seconds"), job


def test_the_recovery_sweep_interval_is_the_setting(settings):
    assert _row(SWEEP_TASK).interval.every == settings.RECOVERY_SWEEP_INTERVAL_S == 5
    settings.RECOVERY_SWEEP_INTERVAL_S = 2.0
    result = periodic_jobs_sync()
    assert result.updated == [OWNED_PREFIX + "Recovery sweep: dead and hung instances"]
    assert (_row(SWEEP_TASK).interval.every, _row(SWEEP_TASK).interval.period) == (2, "seconds")
    settings.RECOVERY_SWEEP_INTERVAL_S = 0.5  # finer than a second: IntervalSchedule holds whole units
    periodic_jobs_sync()
    assert (_row(SWEEP_TASK).interval.every, _row(SWEEP_TASK).interval.period) == (500_000, "microseconds")
    assert _row(SWEEP_TASK).schedule.run_every.total_seconds() == 0.5  # what beat will run it at


def test_the_sync_is_idempotent_and_writes_nothing_when_rows_match():
    periodic_jobs_sync()
    rows = list(PeriodicTask.objects.order_by("id").values())
    changed_at = PeriodicTasks.last_change()
    intervals = IntervalSchedule.objects.count()
    result = periodic_jobs_sync()
    assert (result.created, result.updated, result.deleted) == ([], [], [])
    assert list(PeriodicTask.objects.order_by("id").values()) == rows
    assert PeriodicTasks.last_change() == changed_at  # beat is not told to reload for nothing
    assert IntervalSchedule.objects.count() == intervals


def test_staff_edits_to_owned_rows_are_reverted_and_hand_made_rows_are_left_alone():
    every_hour, _ = IntervalSchedule.objects.get_or_create(every=3600, period="seconds")
    PeriodicTask.objects.filter(task=SWEEP_TASK).update(enabled=False, interval=every_hour)
    mine = PeriodicTask.objects.create(name="Nightly report", task=SWEEP_TASK, interval=every_hour)
    periodic_jobs_sync()
    sweep = PeriodicTask.objects.get(name=OWNED_PREFIX + "Recovery sweep: dead and hung instances")
    assert sweep.enabled and sweep.interval.every == 5
    mine.refresh_from_db()
    assert (mine.name, mine.enabled, mine.interval_id) == ("Nightly report", True, every_hour.pk)


def test_a_job_no_longer_declared_is_deleted_and_a_disabled_one_stays_disabled():
    kept, dropped = PERIODIC_JOBS[0], PERIODIC_JOBS[1]
    jobs = (PeriodicJob(kept.name, kept.task, kept.every_s, enabled=False), *PERIODIC_JOBS[2:])
    result = periodic_jobs_sync(jobs)
    assert result.deleted == [dropped.row_name]
    assert not PeriodicTask.objects.filter(name=dropped.row_name).exists()
    assert PeriodicTask.objects.get(name=kept.row_name).enabled is False
    periodic_jobs_sync()  # declared again: back as it was
    assert PeriodicTask.objects.get(name=dropped.row_name).enabled


def test_rows_an_older_release_registered_by_migration_are_adopted_with_their_history():
    """Databases that ran the old data migrations hold the jobs under their bare names: renamed, not doubled."""
    job = next(j for j in PERIODIC_JOBS if j.task == SWEEP_TASK)
    legacy = PeriodicTask.objects.get(name=job.row_name)
    legacy.name, legacy.total_run_count = job.name, 41
    legacy.save()
    periodic_jobs_sync()
    assert list(PeriodicTask.objects.filter(task=SWEEP_TASK).values_list("pk", "name", "total_run_count")) == [
        (legacy.pk, job.row_name, 41)]


def test_migrate_applies_a_changed_setting(settings):
    settings.RECOVERY_SWEEP_INTERVAL_S = 3.0
    call_command("migrate", verbosity=0)  # nothing to migrate; post_migrate still runs the sync
    assert _row(SWEEP_TASK).interval.every == 3
