"""The archive store's contract: control-plane archives kept outside every tenant's prefix. No I/O here.

Schema archives (deprovisioning's ``final``, the periodic ``backup``s) are written under
``archives/<tenant-id>/<label>-<UTC time>.sql.gz.enc``. Each object-store driver has exactly one
implementation (``LocalArchives`` in ``local_objectstore``, ``S3Archives`` in ``s3_objectstore``) that
``schema_archive`` writes and reads through and ``archive_expiry`` lists and deletes through, so the
layout and the name rule below exist once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from controlplane.errors import ProvisioningError

__all__ = ["ARCHIVE_SUFFIX", "ArchiveStore", "StoredArchive", "archive_key", "is_archive"]

ARCHIVE_SUFFIX = ".sql.gz.enc"


@dataclass(frozen=True)
class StoredArchive:
    tenant_id: str
    name: str
    size_bytes: int
    modified_at: datetime


def is_archive(tenant_id: str, name: str) -> bool:
    """A tenant folder named by a UUID and a sealed dump's name; ``.tmp`` leftovers of a killed writer are not."""
    try:
        uuid.UUID(tenant_id)
    except ValueError:
        return False
    return name.endswith(ARCHIVE_SUFFIX) and "/" not in name


def archive_key(tenant_id: str, name: str) -> str:
    """``archives/<tenant-id>/<name>``; anything that could escape the tenant's folder is refused."""
    if not is_archive(tenant_id, name):
        raise ProvisioningError(f"archive name {name!r} refused")
    return f"archives/{tenant_id}/{name}"


@runtime_checkable
class ArchiveStore(Protocol):
    def put(self, tenant_id: str, name: str, blob: bytes) -> str:
        """Store an archive (already sealed) and return its URL; a reader never sees a half-written one."""
        ...

    def get(self, tenant_id: str, name: str) -> bytes:
        """The stored bytes; ``ProvisioningError`` when the archive cannot be read."""
        ...

    def list(self) -> Iterator[StoredArchive]:
        """Every archive in the store, grouped by tenant."""
        ...

    def delete(self, tenant_id: str, name: str) -> None:
        """Remove the archive; one already gone is not an error."""
        ...

    def url(self, tenant_id: str, name: str) -> str: ...
