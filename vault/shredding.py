"""Crypto-shredding: a retired data key is destroyed once nothing it sealed can still exist.

Destroying a key erases its wrapped bytes (the only copy the vault holds) and marks it ``destroyed``: no
key-encryption key can unwrap it again, so every ciphertext it sealed - an archive copied elsewhere, a
credential version still in a table - stops opening. Who still needs a retired key, by purpose:

- ``objects`` of a tenant that is not deleted: always kept. The runtime's own objects (tool outputs,
  snapshots, index backups) are never re-encrypted by a rotation and the control plane does not list them,
  so any of them may be sealed under any version.
- ``objects`` of a deleted tenant: kept while an archive that may still exist (``SealedArchive`` not
  ``deleted``) names that version or names none (an archive the inventory could not attribute).
- ``credentials``: kept while a credential version of the tenant is sealed under it; for a deleted tenant,
  while any of its archives may still exist (its credentials go with its last restore point).
- every purpose: kept for ``VAULT_SHRED_GRACE_S`` after retirement (a reader that fetched a ciphertext
  just before a rotation still opens it).

The decision reads ``SealedArchive``, so the caller first brings it up to date with the object store
(``provisioning.databases.archive_expiry`` inventories the store, then calls ``data_keys_shred``). No object-store
I/O here; a key is never re-derived, only the vault's copy is erased.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants.actors import SYSTEM
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Tenant

from .choices import ARCHIVE_MAY_EXIST, KeyPurpose, KeyStatus
from .models import CredentialVersion, SealedArchive, TenantDataKey
from .services import data_key_cache_forget

__all__ = [
    "ShredReport", "DEFAULT_SHRED_GRACE_S", "sealed_archive_record", "data_key_needed_by", "data_keys_shred",
]

log = logging.getLogger(__name__)

DEFAULT_SHRED_GRACE_S = 24 * 3600.0


@dataclass
class ShredReport:
    destroyed: list[tuple[str, str, int]] = field(default_factory=list)  # (tenant id, purpose, version)
    kept: Counter[str] = field(default_factory=Counter)  # reason -> retired keys kept for it

    def as_dict(self) -> dict[str, object]:
        return {"destroyed": len(self.destroyed), "kept": dict(self.kept)}


def _grace() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "VAULT_SHRED_GRACE_S", DEFAULT_SHRED_GRACE_S)))


def sealed_archive_record(
    *, tenant: Tenant, name: str, url: str, label: str, key_version: int | None, size_bytes: int,
    taken_at: datetime, expires_at: datetime, discovered: bool = False,
) -> SealedArchive:
    """Record an archive in the object store sealed under ``key_version`` (idempotent: one row per name).

    The expiry job's inventory of the store calls it for every archive it finds that has no row yet, right
    before ``data_keys_shred`` reads the rows; a writer of archives may call it too, as soon as it stored one.
    """
    row, _ = SealedArchive.objects.get_or_create(
        tenant=tenant, name=name,
        defaults={"url": url, "label": label[:40], "key_version": key_version, "size_bytes": size_bytes,
                  "taken_at": taken_at, "expires_at": expires_at, "discovered": discovered},
    )
    return row


def data_key_needed_by(key: TenantDataKey, *, now: datetime | None = None) -> str | None:
    """Why ``key`` must stay (a short reason), or None when it is retired and nothing it sealed can still exist."""
    now = now or timezone.now()
    if key.status != KeyStatus.RETIRED:
        return str(key.status)  # active keys are in use; destroyed ones have nothing left
    if key.retired_at is None or key.retired_at > now - _grace():
        return "grace"
    tenant = key.tenant
    if tenant.status == TenantStatus.DELETED:
        may_exist = SealedArchive.objects.filter(tenant=tenant, state__in=ARCHIVE_MAY_EXIST)
        if key.purpose == KeyPurpose.OBJECTS:
            may_exist = may_exist.filter(Q(key_version=key.version) | Q(key_version__isnull=True))
        return "archive" if may_exist.exists() else None
    if key.purpose == KeyPurpose.OBJECTS:
        return "tenant-objects"
    if CredentialVersion.objects.filter(credential__tenant=tenant, data_key_version=key.version).exists():
        return "credential"
    return None


def _destroy(key_id: int, now: datetime) -> TenantDataKey | None:
    """Erase one key's wrapped bytes if it is still not needed, re-checked under the row lock; audited with it."""
    with transaction.atomic():
        key = TenantDataKey.objects.select_for_update().select_related("tenant").get(pk=key_id)
        if data_key_needed_by(key, now=now) is not None:
            return None
        key.wrapped_key = b""
        key.status = KeyStatus.DESTROYED
        key.destroyed_at = now
        key.save(update_fields=["wrapped_key", "status", "destroyed_at"])
        audit_record(
            actor=SYSTEM, action=AuditAction.VAULT_DATA_KEY_DESTROY, target=key, tenant=key.tenant,
            data={"purpose": key.purpose, "version": key.version, "kek_id": key.kek_id,
                  "kek_fingerprint": key.kek_fingerprint,
                  "retired_at": key.retired_at.isoformat() if key.retired_at else None},
        )
    data_key_cache_forget(tenant_id=key.tenant_id, purpose=key.purpose, version=key.version)
    return key


def data_keys_shred(*, now: datetime | None = None) -> ShredReport:
    """Destroy every retired data key nothing needs any more (see the module docstring); safe to re-run.

    The caller has just brought ``SealedArchive`` up to date with the object store. Each key is decided and
    destroyed in its own transaction, so a run killed midway leaves every key either retired or destroyed.
    """
    now = now or timezone.now()
    report = ShredReport()
    retired = (TenantDataKey.objects.filter(status=KeyStatus.RETIRED).select_related("tenant")
               .order_by("tenant_id", "purpose", "version"))
    for key in list(retired):  # retired keys are few (a handful per tenant); no server-side cursor
        reason = data_key_needed_by(key, now=now)
        if reason is not None:
            report.kept[reason] += 1
            continue
        destroyed = _destroy(key.pk, now)
        if destroyed is None:
            report.kept["changed"] += 1
            continue
        report.destroyed.append((str(key.tenant_id), key.purpose, key.version))
        log.info("vault: destroyed %s data key v%s of tenant %s", key.purpose, key.version, key.tenant_id)
    return report
