"""Expired schema archives are deleted from the object store, then retired data keys nothing needs are destroyed.

Every archive ``schema_archive`` writes (deprovisioning's ``final``, and every periodic ``backup``: one per tenant
per ``SCHEMA_BACKUP_INTERVAL_S``, so about 120 per live tenant at the default 6 h and 30 days) lands in the store
under ``archives/<tenant-id>/<label>-<UTC time>.sql.gz.enc``; the tenant's database resource records only the
newest. So each run first takes an inventory of the store: an archive with no ``vault.SealedArchive`` row gets one
(expiry from the time in its name plus ``SCHEMA_ARCHIVE_RETENTION_DAYS``; the key version from the resource record,
or, for a deleted tenant, by opening it with each of its object keys). Then each expired archive moves
stored -> deleting (and the resource record stops naming it) -> deleted from the store -> deleted, each move
committed, so a run killed anywhere converges on the next run and no row ever claims an archive that is gone.
An archive found in the store again after its row said deleted is tracked again and deleted again.

Kept past its expiry: the archive the database resource names for a tenant that is not deleted (the only restore
point of a schema, e.g. a suspended tenant's, which periodic backups skip).

Only when the inventory completed does the run destroy keys (``vault.shredding.data_keys_shred``), which relies on
every archive that may exist having its row. The store is the object-store driver's ``archives()``, the same one
``schema_archive`` writes through (``drivers/archives.py`` holds its contract and name rule).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.errors import ApplicationError
from controlplane.locks import AdvisoryLock
from provisioning.choices import ResourceKind
from provisioning.drivers.archives import ArchiveStore, StoredArchive
from provisioning.drivers.registry import objectstore_driver
from provisioning.models import ProvisionedResource
from tenants.actors import SYSTEM
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Tenant
from vault.choices import ArchiveState, KeyPurpose, KeyStatus
from vault.envelope import object_aad, open_sealed
from vault.models import SealedArchive, TenantDataKey
from vault.services import tenant_object_key
from vault.shredding import ShredReport, data_keys_shred, sealed_archive_record

__all__ = [
    "StoredArchive", "ArchiveStore", "InventoryReport", "ExpiryReport", "archive_store", "archive_inventory",
    "archives_expire", "archives_expire_and_shred",
]

log = logging.getLogger(__name__)

_NAME_TIME = re.compile(r"-(\d{8}T\d{12})\.sql\.gz\.enc$")
# The resource record's pointer to its newest archive; the label and time stay (backups schedule by the time).
_POINTER_KEYS = ("archive_url", "archive_name", "archive_key_version", "archive_expires_at", "archive_bytes")


def archive_store() -> ArchiveStore:
    """The configured profile's archive store: its object-store driver's own (one local, one S3)."""
    return objectstore_driver().archives()


# --- inventory -----------------------------------------------------------------------------------------------


@dataclass
class InventoryReport:
    complete: bool = False
    seen: int = 0
    recorded: int = 0  # archives found with no row, now recorded
    tracked_again: int = 0  # rows that said deleted while the archive was still there
    unknown_tenant: int = 0  # folders naming no tenant of ours (left alone)
    error: str = ""


def _taken_at(item: StoredArchive) -> datetime:
    match = _NAME_TIME.search(item.name)
    if match:
        return datetime.strptime(match.group(1), "%Y%m%dT%H%M%S%f").replace(tzinfo=UTC)
    return item.modified_at


def _key_version(tenant: Tenant, item: StoredArchive, store: ArchiveStore, newest: dict[str, Any]) -> int | None:
    """Which object-key version sealed the archive: the resource record knows for its newest one; for a deleted
    tenant (whose keys shredding may destroy) the one that opens it. None: unknown, which keeps every version."""
    if newest.get("archive_name") == item.name and newest.get("archive_key_version") is not None:
        return int(newest["archive_key_version"])
    if tenant.status != TenantStatus.DELETED:
        return None  # a live tenant's object keys are never destroyed: not worth reading the archive
    blob = store.get(str(tenant.pk), item.name)
    aad = object_aad(str(tenant.pk), f"archives/{item.name}")
    versions = (TenantDataKey.objects.filter(tenant=tenant, purpose=KeyPurpose.OBJECTS)
                .exclude(status=KeyStatus.DESTROYED).order_by("-version").values_list("version", flat=True))
    for version in versions:
        try:
            open_sealed(tenant_object_key(tenant=tenant, version=version), blob, aad)
        except ApplicationError:  # not this version (or it cannot be unwrapped here): try the next
            continue
        return int(version)
    return None


def archive_inventory(*, store: ArchiveStore, now: datetime | None = None) -> InventoryReport:
    """Give every archive in the store a ``SealedArchive`` row; idempotent. ``complete`` only if the whole listing
    was read."""
    now = now or timezone.now()
    report = InventoryReport()
    retention = timedelta(days=settings.SCHEMA_ARCHIVE_RETENTION_DAYS)
    for tenant_id, group in groupby(store.list(), key=lambda item: item.tenant_id):
        items = list(group)
        report.seen += len(items)
        tenant = Tenant.objects.filter(pk=tenant_id).first()
        if tenant is None:
            report.unknown_tenant += len(items)
            continue
        rows = {row.name: row for row in SealedArchive.objects.filter(tenant=tenant, name__in=[i.name for i in items])}
        database = ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.DATABASE).first()
        newest = database.details if database is not None else {}
        for item in items:
            row = rows.get(item.name)
            if row is None:
                taken = _taken_at(item)
                sealed_archive_record(
                    tenant=tenant, name=item.name, url=store.url(tenant_id, item.name),
                    label=item.name.rsplit("-", 1)[0], key_version=_key_version(tenant, item, store, newest),
                    size_bytes=item.size_bytes, taken_at=taken, expires_at=taken + retention, discovered=True,
                )
                report.recorded += 1
            elif row.state == ArchiveState.DELETED:
                # Deleted, yet listed: a write behind our back, or a store that lost the delete. Delete it again.
                SealedArchive.objects.filter(pk=row.pk, state=ArchiveState.DELETED).update(
                    state=ArchiveState.DELETING, deleted_at=None)
                report.tracked_again += 1
    report.complete = True
    return report


# --- expiry --------------------------------------------------------------------------------------------------


@dataclass
class ExpiryReport:
    deleted: list[tuple[str, str]] = field(default_factory=list)  # (tenant id, archive name)
    kept_as_restore_point: int = 0
    failed: int = 0


def _is_restore_point(row: SealedArchive) -> bool:
    """The archive a not-deleted tenant's database resource names: recovery restores its schema from it."""
    if row.tenant.status == TenantStatus.DELETED:
        return False
    return ProvisionedResource.objects.filter(
        tenant_id=row.tenant_id, kind=ResourceKind.DATABASE, details__archive_name=row.name).exists()


def _forget_pointer(row: SealedArchive, now: datetime) -> None:
    """Stop the database resource naming this archive (one statement: a newer archive recorded meanwhile wins)."""
    table = ProvisionedResource._meta.db_table
    removed = " - ".join(["details"] + ["%s::text"] * len(_POINTER_KEYS))
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {table} SET details = ({removed}) || jsonb_build_object('archive_deleted_at', %s::text), "  # noqa: S608 - our table
            "updated_at = now() WHERE tenant_id = %s AND kind = %s AND details->>'archive_name' = %s",
            [*_POINTER_KEYS, now.isoformat(), row.tenant_id, ResourceKind.DATABASE, row.name],
        )


def _delete_one(row: SealedArchive, store: ArchiveStore, now: datetime) -> bool:
    with transaction.atomic():
        marked = SealedArchive.objects.filter(pk=row.pk, state__in=[ArchiveState.STORED, ArchiveState.DELETING]) \
            .update(state=ArchiveState.DELETING)
        if not marked:
            return False  # deleted by a run that overlapped this one's listing
        _forget_pointer(row, now)
    try:
        store.delete(str(row.tenant_id), row.name)
    except Exception as exc:  # noqa: BLE001 - stays ``deleting``; the next run tries again
        log.warning("archive expiry: deleting %s of tenant %s failed: %s", row.name, row.tenant_id,
                    type(exc).__name__)
        return False
    with transaction.atomic():
        if SealedArchive.objects.filter(pk=row.pk, state=ArchiveState.DELETING).update(
                state=ArchiveState.DELETED, deleted_at=now):
            audit_record(actor=SYSTEM, action=AuditAction.ARCHIVE_DELETE, target=row, tenant=row.tenant,
                         data={"name": row.name, "label": row.label, "key_version": row.key_version,
                               "expires_at": row.expires_at.isoformat(), "bytes": row.size_bytes})
    return True


def archives_expire(*, store: ArchiveStore, now: datetime | None = None) -> ExpiryReport:
    """Delete every expired archive (and finish deletions a killed run started); safe to re-run."""
    now = now or timezone.now()
    report = ExpiryReport()
    due = (SealedArchive.objects.select_related("tenant")
           .filter(state__in=[ArchiveState.STORED, ArchiveState.DELETING], expires_at__lte=now)
           .order_by("expires_at", "id"))
    for row in list(due[:10_000]):  # a backlog drains over several runs
        if row.state == ArchiveState.STORED and _is_restore_point(row):
            report.kept_as_restore_point += 1
            continue
        if _delete_one(row, store, now):
            report.deleted.append((str(row.tenant_id), row.name))
        else:
            report.failed += 1
    return report


def archives_expire_and_shred(*, now: datetime | None = None) -> dict[str, Any]:
    """The periodic job: inventory, expiry, then crypto-shredding if the inventory completed. One run at a time."""
    now = now or timezone.now()
    with AdvisoryLock("archive-expiry-and-shred") as lock:
        if not lock.held:
            return {"busy": True}
        store = archive_store()
        try:
            inventory = archive_inventory(store=store, now=now)
        except Exception as exc:  # noqa: BLE001 - no shredding on a partial inventory; expiry of known rows is safe
            log.warning("archive expiry: inventory of the object store failed: %s", type(exc).__name__)
            inventory = InventoryReport(error=type(exc).__name__)
        expiry = archives_expire(store=store, now=now)
        shred = data_keys_shred(now=now) if inventory.complete else ShredReport()
    result = {
        "inventory": {"complete": inventory.complete, "seen": inventory.seen, "recorded": inventory.recorded,
                      "tracked_again": inventory.tracked_again, "unknown_tenant": inventory.unknown_tenant,
                      "error": inventory.error},
        "archives": {"deleted": len(expiry.deleted), "kept_as_restore_point": expiry.kept_as_restore_point,
                     "failed": expiry.failed},
        "keys": shred.as_dict() | {"skipped": not inventory.complete},
    }
    log.info("archive expiry and shredding: %s", result)
    return result
