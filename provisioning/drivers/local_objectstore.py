"""Object-store driver for the local profile: a 0700 directory per tenant prefix ``tenants/<id>/``.

Objects are encrypted client-side by the runtime with the tenant's object key, so the
layout on disk is the same as an S3 bucket's with a prefix per tenant. Archives of
deprovisioned tenants and periodic backups go under ``archives/<id>/``, outside the tenant's own
prefix (``LocalArchives``: the local profile's one archive store). Where instances are sandboxed the
prefix belongs to the tenant's system user.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from controlplane.errors import ProvisioningError

from .archives import ArchiveStore, StoredArchive, archive_key, is_archive
from .base import Observed, Ref, TenantSpec
from .local_sandbox import ensure_instance_user, give_to_instance
from .protocols import Capability, ObjectStoreDriver

__all__ = ["LocalArchives", "LocalObjectStoreDriver", "tree_bytes"]


class LocalArchives:
    """Archives as files under ``<root>/archives/<tenant-id>/``, the same layout as the S3 bucket's keys."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, tenant_id: str, name: str) -> Path:
        return self.root / archive_key(tenant_id, name)

    def put(self, tenant_id: str, name: str, blob: bytes) -> str:
        path = self._path(tenant_id, name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(path.suffix + ".tmp")  # renamed into place: a reader never sees half an archive
        tmp.write_bytes(blob)
        tmp.replace(path)
        return path.as_uri()

    def get(self, tenant_id: str, name: str) -> bytes:
        try:
            return self._path(tenant_id, name).read_bytes()
        except OSError as exc:
            raise ProvisioningError(f"archive {name!r} of tenant {tenant_id} is not readable: {exc}") from None

    def list(self) -> Iterator[StoredArchive]:
        top = self.root / "archives"
        if not top.is_dir():
            return
        for folder in sorted(top.iterdir()):
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if is_archive(folder.name, path.name):
                    st = path.stat()
                    yield StoredArchive(folder.name, path.name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def delete(self, tenant_id: str, name: str) -> None:
        self._path(tenant_id, name).unlink(missing_ok=True)

    def url(self, tenant_id: str, name: str) -> str:
        return self._path(tenant_id, name).as_uri()


def tree_bytes(root: Path) -> int:
    """The sizes of the regular files under ``root`` (symlinks not followed; a file removed while walking is
    skipped): what a directory-backed store or volume holds, for usage metering. 0 if ``root`` is missing."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


class LocalObjectStoreDriver(ObjectStoreDriver):
    name = "local-fs"
    capabilities = frozenset({Capability.MEASURE_BYTES})

    def _root(self) -> Path:
        return Path(settings.LOCAL_OBJECTSTORE_ROOT)

    def _prefix(self, spec: TenantSpec) -> Path:
        return self._root() / "tenants" / spec.tenant_id

    def ensure(self, spec: TenantSpec) -> Ref:
        prefix = self._prefix(spec)
        prefix.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        prefix.mkdir(mode=0o700, exist_ok=True)
        prefix.chmod(0o700)
        give_to_instance(prefix, ensure_instance_user(spec))
        url = prefix.as_uri() + "/"
        return Ref(external_id=url, details={"url": url, "prefix": f"tenants/{spec.tenant_id}/"})

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        prefix = self._prefix(spec)
        if not prefix.is_dir():
            return Observed(exists=False, healthy=False, detail=f"{prefix} is missing")
        return Observed(exists=True, healthy=True)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        shutil.rmtree(self._prefix(spec), ignore_errors=True)

    def archives(self) -> ArchiveStore:
        return LocalArchives(self._root())

    def bytes_used(self, spec: TenantSpec) -> int:
        return tree_bytes(self._prefix(spec))
