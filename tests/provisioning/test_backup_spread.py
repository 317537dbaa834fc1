"""Schema backups are spread so the interval holds for any fleet size (issue 16): each run takes its share.

The archive itself (pg_dump of a real schema) is tested with recovery; here only which tenants a run picks,
against real rows: a fixed 100 per 10-minute run used to break the 6-hour promise past about 3,600 tenants.
"""

from __future__ import annotations

import math

import pytest
from django.utils import timezone

from provisioning.databases.backups import backup_batch
from provisioning.models import ProvisionedResource
from tenants.models import Tenant

pytestmark = pytest.mark.django_db

HOURS_6 = 6 * 3600


def _tenants(operator, n: int, *, archived_hours_ago: list[float | None]) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    now = timezone.now().timestamp()
    for i in range(n):
        tenant = Tenant.objects.create(operator=operator, slug=f"bk-{i}", name=f"Bk {i}", status="ready")
        ago = archived_hours_ago[i % len(archived_hours_ago)]
        details = {"schema": f"t_{i}"} | ({} if ago is None else {"archive_taken_at": now - ago * 3600})
        ProvisionedResource.objects.create(tenant=tenant, kind="database", driver="postgres-schema", details=details)
        ids.append(str(tenant.pk))
    return ids


def test_a_run_takes_enough_to_hold_the_interval_most_overdue_first(operator, settings):
    settings.SCHEMA_BACKUP_INTERVAL_S = HOURS_6
    ids = _tenants(operator, 400, archived_hours_ago=[None, 7.0, 9.0, 1.0])  # 100 never, 200 overdue, 100 fresh
    batch = backup_batch(run_every_s=600)
    assert len(batch) == math.ceil(400 * 600 / HOURS_6 * 1.25) == 14
    never = {ids[i] for i in range(0, 400, 4)}
    assert set(batch) <= never  # never archived comes first
    # With the never-archived done, the oldest archives (9 h) come before 7 h ones, and fresh ones never.
    ProvisionedResource.objects.filter(tenant_id__in=never).update(
        details={"schema": "x", "archive_taken_at": timezone.now().timestamp()})
    nine = {ids[i] for i in range(2, 400, 4)}
    assert set(backup_batch(run_every_s=600)) <= nine


def test_the_runs_of_one_interval_cover_the_whole_fleet(operator, settings):
    """Backing up each run's batch, the runs of one interval leave nobody overdue."""
    settings.SCHEMA_BACKUP_INTERVAL_S = HOURS_6
    ids = _tenants(operator, 60, archived_hours_ago=[None, 8.0])
    covered: set[str] = set()
    for _ in range(int(HOURS_6 / 600)):  # 36 runs
        batch = backup_batch(run_every_s=600)
        covered |= set(batch)
        ProvisionedResource.objects.filter(tenant_id__in=batch).update(  # what schema_archive records
            details={"schema": "x", "archive_taken_at": timezone.now().timestamp()})
    assert covered == set(ids)


def test_suspended_and_deleted_tenants_are_not_backed_up(operator, settings):
    settings.SCHEMA_BACKUP_INTERVAL_S = HOURS_6
    ids = _tenants(operator, 3, archived_hours_ago=[None])
    Tenant.objects.filter(pk=ids[0]).update(status="suspended")
    Tenant.objects.filter(pk=ids[1]).update(status="deleted")
    assert backup_batch(run_every_s=600) == [ids[2]]


def test_the_run_interval_is_read_from_the_beat_schedule(operator, settings):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from provisioning.databases.backups import BACKUP_TASK

    settings.SCHEMA_BACKUP_INTERVAL_S = HOURS_6
    _tenants(operator, 360, archived_hours_ago=[None])
    every, _ = IntervalSchedule.objects.get_or_create(every=1800, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(task=BACKUP_TASK, defaults={"name": "Schema backups", "interval": every,
                                                                      "enabled": True})
    assert len(backup_batch()) == math.ceil(360 * 1800 / HOURS_6 * 1.25) == 38
