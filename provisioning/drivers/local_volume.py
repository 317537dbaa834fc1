"""Volume driver for the local profile: a 0700 directory per tenant under LOCAL_VOLUME_ROOT.

Where instances are sandboxed the directory belongs to the tenant's own system user
(``local_sandbox``), which lives and dies with the volume: deleting the volume removes it.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

from .base import Observed, Ref, TenantSpec
from .local_sandbox import ensure_instance_user, give_to_instance, remove_instance_user
from .protocols import Capability, VolumeDriver

__all__ = ["LocalVolumeDriver"]

SUBDIRS = ("workspace", ".host")


class LocalVolumeDriver(VolumeDriver):
    name = "local-dir"
    capabilities = frozenset[Capability]()

    def _path(self, spec: TenantSpec) -> Path:
        return Path(settings.LOCAL_VOLUME_ROOT) / spec.resource_name

    def ensure(self, spec: TenantSpec) -> Ref:
        root = self._path(spec)
        Path(settings.LOCAL_VOLUME_ROOT).mkdir(parents=True, exist_ok=True, mode=0o711)
        root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)  # repair drift: mkdir does not change an existing directory's mode
        for sub in SUBDIRS:
            (root / sub).mkdir(mode=0o700, exist_ok=True)
        isolation = ensure_instance_user(spec)
        give_to_instance(root, isolation)
        return Ref(external_id=str(root), details={"path": str(root), **isolation.as_details()})

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        root = self._path(spec)
        if not root.is_dir():
            return Observed(exists=False, healthy=False, detail=f"{root} is missing")
        mode = stat.S_IMODE(root.stat().st_mode)
        if mode != 0o700:
            return Observed(exists=True, healthy=False, detail=f"{root} has mode {mode:o}, expected 700")
        return Observed(exists=True, healthy=True)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        shutil.rmtree(self._path(spec), ignore_errors=True)
        remove_instance_user(spec)
