"""Volume driver for the local profile: a 0700 directory per tenant under LOCAL_VOLUME_ROOT.

Where instances are sandboxed the directory belongs to the tenant's own system user
(``local_sandbox``), which lives and dies with the volume: deleting the volume removes it. There, with
``LOCAL_VOLUME_QUOTA=auto``, the directory is the mount point of an ext4 image of the plan's ``storage``
(``local_volume_image``): a full volume is ENOSPC for its tenant only. A volume made before (a directory with
files in it) stays a plain directory and is recorded ``volume_quota: none``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

from .base import Observed, Ref, TenantSpec
from .local_limits import plan_limits, remove_instance_cgroup
from .local_objectstore import tree_bytes
from .local_sandbox import SANDBOXED, ensure_instance_user, give_to_instance, remove_instance_user
from .local_volume_image import ensure_image_volume, image_path, image_support, remove_image_volume
from .protocols import Capability, VolumeDriver

__all__ = ["LocalVolumeDriver"]

SUBDIRS = ("workspace", ".host")


class LocalVolumeDriver(VolumeDriver):
    name = "local-dir"
    capabilities = frozenset({Capability.MEASURE_BYTES})

    def _path(self, spec: TenantSpec) -> Path:
        return Path(settings.LOCAL_VOLUME_ROOT) / spec.resource_name

    def ensure(self, spec: TenantSpec) -> Ref:
        root = self._path(spec)
        Path(settings.LOCAL_VOLUME_ROOT).mkdir(parents=True, exist_ok=True, mode=0o711)
        isolation = ensure_instance_user(spec)
        quota = self._ensure_quota(spec, root, sandboxed=isolation.mode == SANDBOXED)
        root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)  # repair drift: mkdir does not change an existing directory's mode
        for sub in SUBDIRS:
            (root / sub).mkdir(mode=0o700, exist_ok=True)
        give_to_instance(root, isolation)
        return Ref(external_id=str(root), details={"path": str(root), **quota, **isolation.as_details()})

    @staticmethod
    def _ensure_quota(spec: TenantSpec, root: Path, *, sandboxed: bool) -> dict[str, str | int]:
        """Mount the volume's image (made once, of the plan's storage) where volumes get one; what is recorded."""
        if settings.LOCAL_VOLUME_QUOTA == "off" or not sandboxed:
            return {"volume_quota": "none"}
        ok, reason = image_support()
        if not ok:
            return {"volume_quota": f"none: {reason}"}
        if not image_path(root).exists() and root.is_dir() and any(root.iterdir()):
            return {"volume_quota": "none: a directory volume made before images (its files stay where they are)"}
        size = plan_limits(spec.plan).storage_bytes
        ensure_image_volume(root, size)
        return {"volume_quota": "image", "volume_bytes": size}

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        root = self._path(spec)
        if not root.is_dir():
            return Observed(exists=False, healthy=False, detail=f"{root} is missing")
        mode = stat.S_IMODE(root.stat().st_mode)
        if mode != 0o700:
            return Observed(exists=True, healthy=False, detail=f"{root} has mode {mode:o}, expected 700")
        return Observed(exists=True, healthy=True)

    def bytes_used(self, spec: TenantSpec) -> int:
        # The files' sizes, not the image's: an image volume's file is as big as the plan allows, used or not.
        return tree_bytes(self._path(spec))

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        if image_path(self._path(spec)).exists():
            remove_image_volume(self._path(spec))  # unmounted first: rmtree must not empty a mounted image
        shutil.rmtree(self._path(spec), ignore_errors=True)
        remove_instance_user(spec)
        if os.geteuid() == 0:  # only root made one (the runtime is stopped before the volume goes)
            remove_instance_cgroup(spec.resource_name)
