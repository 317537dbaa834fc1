"""Periodic schema backups, so a schema dropped behind our back can be restored, not recreated empty.

Spread over the interval: each run (every 10 minutes, declared in controlplane/periodic.py; read from beat's row)
archives the most overdue schemas, as many as keep every live tenant within ``SCHEMA_BACKUP_INTERVAL_S``
(with a margin to catch up after an outage). A fixed 100 per run used to break the 6-hour promise past about
3,600 tenants; the selection is one indexed query, not a walk over every tenant.
"""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from controlplane.errors import ApplicationError
from provisioning.choices import ResourceKind
from provisioning.databases.archives import schema_archive
from provisioning.models import ProvisionedResource
from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["schema_backups_run", "backup_batch", "BACKUP_TASK"]

log = logging.getLogger(__name__)

BACKUP_TASK = "provisioning.tasks.schema_backups_task"
_DEFAULT_RUN_EVERY_S = 600.0
_CATCH_UP = 1.25  # runs take a quarter more than the steady rate, so a backlog drains instead of persisting
_LIVE = (TenantStatus.READY, TenantStatus.DEGRADED)


def _run_every_s() -> float:
    """How often beat runs the backup job: the declared interval, as the beat row holds it (0 rows: the default)."""
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.filter(task=BACKUP_TASK, enabled=True).select_related("interval").first()
    if task is None or task.interval is None:
        return _DEFAULT_RUN_EVERY_S
    return task.interval.schedule.run_every.total_seconds()


def backup_batch(*, run_every_s: float | None = None) -> list[str]:
    """Ids of the tenants this run backs up: due ones (never archived first, then the oldest archive), at most
    ceil(live tenants x run interval / backup interval x 1.25)."""
    interval = settings.SCHEMA_BACKUP_INTERVAL_S
    every = run_every_s if run_every_s is not None else _run_every_s()
    databases = ProvisionedResource.objects.filter(kind=ResourceKind.DATABASE, tenant__status__in=_LIVE)
    budget = max(1, math.ceil(databases.count() * every / interval * _CATCH_UP))
    cutoff = timezone.now().timestamp() - interval
    due = (databases.filter(Q(details__archive_taken_at__isnull=True) | Q(details__archive_taken_at__lt=cutoff))
           .order_by(F("details__archive_taken_at").asc(nulls_first=True), "tenant_id")
           .values_list("tenant_id", flat=True)[:budget])
    return [str(pk) for pk in due]


def schema_backups_run(*, limit: int | None = None) -> int:
    """Archive this run's batch; a failed archive is logged and retried by a later run (still the most due)."""
    done = 0
    batch = backup_batch()
    for tenant in Tenant.objects.filter(pk__in=batch[:limit] if limit else batch):
        try:
            schema_archive(tenant=tenant, label="backup")
        except ApplicationError as exc:
            log.warning("backup of %s failed: %s", tenant.pk, exc.detail)
            continue
        done += 1
    return done
