"""Object-store driver for the local profile: a 0700 directory per tenant prefix ``tenants/<id>/``.

Objects are encrypted client-side by the runtime with the tenant's object key, so the
layout on disk is the same as an S3 bucket's with a prefix per tenant. Archives of
deprovisioned tenants go under ``archives/<id>/``, outside the tenant's own prefix. Where
instances are sandboxed the prefix belongs to the tenant's system user.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings

from .base import Observed, Ref, TenantSpec
from .local_sandbox import ensure_instance_user, give_to_instance

__all__ = ["LocalObjectStoreDriver"]


class LocalObjectStoreDriver:
    name = "local-fs"

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

    def put_archive(self, spec: TenantSpec, name: str, blob: bytes) -> str:
        """Store a control-plane archive (already encrypted) and return its URL."""
        folder = self._root() / "archives" / spec.tenant_id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(blob)
        tmp.replace(path)
        return path.as_uri()
