"""A local volume with a size: a per-tenant ext4 image, loop-mounted at the volume's path.

A plain directory shares the control plane's file system: one tenant writing without end fills the disk for
every tenant and for the control plane's own database. The file system here has no project quotas (ext4 mounted
without ``prjquota``; turning them on needs a remount with options of the host's), while loop mounts work for a
root control plane, so each volume becomes a file system of its own, exactly the plan's ``storage`` in size: a
write past it fails with ENOSPC inside that file system only.

The image is sparse (``truncate``): it takes on disk what the tenant wrote, not its plan's size. It lives in
``<LOCAL_VOLUME_ROOT>/.images/`` (hidden from every sandbox with the rest of the volume root). Mounted
``nosuid,nodev``. Nothing here decides whether a volume gets one (``LocalVolumeDriver``) or grows a mounted image
when a plan changes (not done: a larger plan applies to new volumes; ``resize2fs`` would be the step).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from controlplane.errors import ProvisioningError

__all__ = ["image_support", "image_path", "ensure_image_volume", "remove_image_volume"]

_TOOLS = ("mkfs.ext4", "mount", "umount", "truncate")


def image_support() -> tuple[bool, str]:
    """Whether volumes can be images here; otherwise why not (one sentence)."""
    if os.geteuid() != 0:
        return False, "only root can loop-mount a volume image"
    missing = [t for t in _TOOLS if not shutil.which(t)]
    if missing:
        return False, f"missing {', '.join(missing)}"
    if not Path("/dev/loop-control").exists():
        return False, "no /dev/loop-control: this kernel or container gives no loop devices"
    return True, ""


def image_path(volume: Path) -> Path:
    return volume.parent / ".images" / f"{volume.name}.img"


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ProvisioningError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip()[:300]}")


def ensure_image_volume(volume: Path, size_bytes: int) -> None:
    """Make (once) the image of ``size_bytes`` and mount it at ``volume`` (again after a reboot: mounts do not
    survive one). A volume that is already a plain directory with files in it is left as it is, refused here
    rather than hidden under a mount: the caller records it as unbounded."""
    image = image_path(volume)
    if volume.is_mount():
        return
    if not image.exists():
        image.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = image.with_suffix(".tmp")
        _run(["truncate", "-s", str(size_bytes), str(tmp)])
        # No reserved blocks (the tenant gets its whole plan), no lazy init (no background writes after mount).
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(tmp)])
        tmp.replace(image)
    volume.mkdir(mode=0o700, exist_ok=True)
    _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(volume)])
    lost = volume / "lost+found"
    if lost.is_dir() and not any(lost.iterdir()):
        lost.rmdir()  # e2fsck recreates it when needed; the tenant's volume starts empty
    os.chmod(volume, 0o700)


def remove_image_volume(volume: Path, *, busy_wait_s: float = 5.0) -> None:
    """Unmount the volume and delete its image (deprovision; the runtime is stopped before the volume goes).

    The sandbox's outer process keeps the volume as its working directory for a moment after its host exits, so
    a busy mount is retried; one still busy then is detached lazily (gone from the tree at once, its loop device
    released by the kernel with the last user) rather than failing a deprovision over a process on its way out.
    """
    deadline = time.monotonic() + busy_wait_s
    while volume.is_mount():
        done = subprocess.run(["umount", str(volume)], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            break
        if time.monotonic() >= deadline:
            _run(["umount", "--lazy", str(volume)])
            break
        time.sleep(0.1)
    image_path(volume).unlink(missing_ok=True)
