"""Periodic schema backups, so a schema dropped behind our back can be restored, not recreated empty."""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from controlplane.errors import ApplicationError
from tenants.choices import TenantStatus
from tenants.models import Tenant

from .schema_archive import schema_archive

__all__ = ["schema_backups_run"]

log = logging.getLogger(__name__)


def schema_backups_run(*, limit: int = 100) -> int:
    """Archive the schemas whose newest archive is older than SCHEMA_BACKUP_INTERVAL_S (oldest first)."""
    cutoff = timezone.now().timestamp() - settings.SCHEMA_BACKUP_INTERVAL_S
    done = 0
    for tenant in Tenant.objects.filter(status__in=(TenantStatus.READY, TenantStatus.DEGRADED)).order_by("updated_at"):
        resource = tenant.resources.filter(kind="database").first()
        if resource is None:
            continue
        if resource.details.get("archive_taken_at", 0) > cutoff:
            continue
        try:
            schema_archive(tenant=tenant, label="backup")
        except ApplicationError as exc:
            log.warning("backup of %s failed: %s", tenant.pk, exc.detail)
            continue
        done += 1
        if done >= limit:
            break
    return done
