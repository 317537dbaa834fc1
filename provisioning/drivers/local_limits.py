"""Kernel-enforced resource limits per local instance: a cgroup of its own, and rlimits as a second line.

Without these a local instance inherits the worker's limits: one tenant's agent can allocate the machine's
memory, start processes until ``pid_max`` and keep every core busy, taking every other tenant down with it.

The numbers are the plan's, from the table the Kubernetes profile sizes its ResourceQuota and LimitRange with
(``KUBERNETES_PLANS``: ``memory_limit``, ``cpu_limit``, ``storage``, and ``pids``), so a plan means the same on both.

- **cgroup** (v1 per-controller hierarchies or the v2 unified one, read from ``/proc/mounts``): one per instance,
  ``<parent>/agent-instances/<resource name>`` for memory (swap included where the kernel accounts it), pids and
  cpu (CFS quota), created before the start. The sandbox's first process writes its own pid into each
  ``cgroup.procs`` and only then execs bubblewrap (``cgroup_enter_argv``), so nothing of the instance ever runs
  outside it, and all its children are born inside.
- **rlimits** (``prlimit`` before ``setpriv``): ``RLIMIT_NPROC`` (counted per uid, and each tenant has its own) and
  ``RLIMIT_FSIZE`` (no single file larger than the plan's storage). Not ``RLIMIT_AS``/``RLIMIT_DATA``: they count
  address space reserved, not memory used (glibc reserves 64 MiB per thread arena), so a limit near the plan's
  memory kills a healthy host and one far above it bounds nothing the cgroup does not.

No disk quota here: see docs/security.md ("Known limits"). Nothing in this module decides whether an instance is
sandboxed (``local_sandbox``) or starts it (``local_process``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from controlplane.errors import ProvisioningError

__all__ = ["InstanceLimits", "CgroupLayout", "plan_limits", "cgroup_layout", "ensure_instance_cgroup",
           "remove_instance_cgroup", "cgroup_enter_argv", "rlimit_argv", "oom_kills", "instance_cgroup_dirs",
           "own_cgroup_line", "ENTER_FAILED"]

_CONTROLLERS = ("memory", "pids", "cpu")
_GROUP = "agent-instances"
_CFS_PERIOD_US = 100_000
# Exit status of the enter step when the kernel refuses to place the process (never the host's own status).
ENTER_FAILED = 121
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True)
class InstanceLimits:
    """One plan's limits in the kernel's units."""

    memory_bytes: int
    pids: int
    cpu_millicores: int
    storage_bytes: int


@dataclass(frozen=True)
class CgroupLayout:
    """Where this machine's cgroups are: ``version`` 1 or 2, and the parent directory per controller (v2: one
    directory for all) under which instance cgroups are made; empty when none can be made here."""

    version: int
    parents: dict[str, Path]
    reason: str = ""


def _quantity(text: str) -> int:
    """A Kubernetes quantity ("1Gi", "512Mi", "5G", "3") as an integer."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kMGT]i?)?\s*", str(text))
    if not match:
        raise ProvisioningError(f"not a quantity: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def _millicores(text: str) -> int:
    text = str(text).strip()
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def plan_limits(plan: str) -> InstanceLimits:
    """The limits of ``plan`` from the plan table both profiles read; a plan it does not size is refused (an
    instance without limits is what this module exists to prevent)."""
    values = settings.KUBERNETES_PLANS.get(plan)
    if values is None:
        raise ProvisioningError(f"plan {plan!r} has no resources configured (KUBERNETES_PLANS): an instance is never "
                                "started without limits")
    return InstanceLimits(memory_bytes=_quantity(values["memory_limit"]), pids=int(values.get("pids", 256)),
                          cpu_millicores=_millicores(values["cpu_limit"]), storage_bytes=_quantity(values["storage"]))


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller, and "" for the v2 hierarchy (``/proc/self/cgroup``)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def cgroup_layout() -> CgroupLayout:
    """v1 where the memory, pids and cpu controllers are mounted as v1 hierarchies (this one hierarchy per
    controller), else v2 where a cgroup2 file system has them; the parent is ``LOCAL_INSTANCE_CGROUP_PARENT``
    when set (a delegated cgroup), else this process's own cgroup (children of it: the limits nest under
    whatever the machine gives the control plane)."""
    mounts: dict[str, Path] = {}
    unified: Path | None = None
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, where, fstype, options, *_ = line.split()
        if fstype == "cgroup":
            for name in set(options.split(",")) & set(_CONTROLLERS):
                mounts[name] = Path(where)
        elif fstype == "cgroup2" and unified is None:
            unified = Path(where)
    own = _own_paths()
    chosen = settings.LOCAL_INSTANCE_CGROUP_PARENT.strip("/")
    if all(c in mounts for c in _CONTROLLERS):
        parents = {c: mounts[c] / (chosen or own.get(c, "/").strip("/")) / _GROUP for c in _CONTROLLERS}
        return CgroupLayout(version=1, parents=parents)
    if unified is not None:
        available = set((unified / "cgroup.controllers").read_text().split())
        missing = set(_CONTROLLERS) - available
        if missing:
            return CgroupLayout(version=2, parents={}, reason=f"cgroup v2 lacks {', '.join(sorted(missing))}")
        return CgroupLayout(version=2, parents={"": unified / (chosen or own.get("", "/").strip("/")) / _GROUP})
    return CgroupLayout(version=0, parents={}, reason="no memory, pids and cpu cgroup controllers are mounted")


def instance_cgroup_dirs(name: str, layout: CgroupLayout | None = None) -> list[Path]:
    """The instance's cgroup directories (one per v1 controller, one in v2), made or not."""
    layout = layout or cgroup_layout()
    return [parent / name for parent in layout.parents.values()]


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def ensure_instance_cgroup(name: str, limits: InstanceLimits) -> list[Path]:
    """Make (once) the instance's cgroups and (every time: a plan may change) write its limits into them.

    Raises ProvisioningError when they cannot be made: the caller refuses to start an instance without them
    where the sandbox runs (root), because a sandboxed instance that can take the machine is not isolated.
    """
    layout = cgroup_layout()
    if not layout.parents:
        raise ProvisioningError(f"cannot bound the instance's resources: {layout.reason}")
    dirs = instance_cgroup_dirs(name, layout)
    try:
        for (controller, parent), path in zip(layout.parents.items(), dirs, strict=True):
            if layout.version == 2:
                # Children of the parent may use the controllers only once the parent hands them down.
                for level in (parent.parent, parent):
                    level.mkdir(exist_ok=True)
                    _write(level / "cgroup.subtree_control", " ".join(f"+{c}" for c in _CONTROLLERS))
            path.mkdir(parents=True, exist_ok=True)
            if layout.version == 2:
                _write(path / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(FileNotFoundError):
                    _write(path / "memory.swap.max", "0")
                _write(path / "pids.max", str(limits.pids))
                _write(path / "cpu.max", f"{limits.cpu_millicores * _CFS_PERIOD_US // 1000} {_CFS_PERIOD_US}")
            elif controller == "memory":
                _limit_memory_v1(path, limits.memory_bytes)
            elif controller == "pids":
                _write(path / "pids.max", str(limits.pids))
            elif controller == "cpu":
                _write(path / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
                _write(path / "cpu.cfs_quota_us", str(limits.cpu_millicores * _CFS_PERIOD_US // 1000))
    except OSError as exc:
        raise ProvisioningError(f"cannot set up the instance's cgroup {name}: {exc}") from exc
    return dirs


def _limit_memory_v1(path: Path, limit: int) -> None:
    """memory.limit_in_bytes, and memsw (memory + swap) to the same where swap is accounted, so that swapping
    out does not stretch the plan; memsw must never be below the plain limit, hence the order."""
    memsw = path / "memory.memsw.limit_in_bytes"
    current = int((path / "memory.limit_in_bytes").read_text())
    if memsw.exists() and limit > current:
        _write(memsw, str(limit))
        _write(path / "memory.limit_in_bytes", str(limit))
        return
    _write(path / "memory.limit_in_bytes", str(limit))
    if memsw.exists():
        _write(memsw, str(limit))


def remove_instance_cgroup(name: str) -> None:
    """Remove the instance's cgroups (deprovision); the kernel refuses while a process is still inside."""
    for path in instance_cgroup_dirs(name):
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()


def cgroup_enter_argv(dirs: list[Path], argv: list[str]) -> list[str]:
    """``argv`` preceded by a step that puts its own process into ``dirs`` and then execs it (same pid), so the
    process is inside before the first instruction of the sandbox runs. ``sh``: it needs no Python start-up,
    and its ``exec`` keeps the pid the driver records."""
    script = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit '
              f'{ENTER_FAILED}; shift; n=$((n-1)); done; exec "$@"')
    return ["/bin/sh", "-c", script, "cgroup-enter", str(len(dirs)), *map(str, dirs), *argv]


def rlimit_argv(limits: InstanceLimits) -> list[str]:
    """``prlimit`` setting the second line of limits on itself before it execs the rest (inherited from there).

    ``RLIMIT_NPROC`` at twice the pids limit: the cgroup is what bites; this one holds if the cgroup is ever lost
    (an instance moved out by an operator, a controller unmounted), per uid, and each tenant has its own uid.
    """
    return [shutil.which("prlimit") or "prlimit", f"--nproc={limits.pids * 2}", f"--fsize={limits.storage_bytes}",
            "--core=0", "--"]


def oom_kills(name: str) -> int | None:
    """How many times the kernel's OOM killer has killed in the instance's cgroup (None: no cgroup).

    The exit of a SIGKILLed host is an OOM kill when this count went up since it started: the exit status alone
    cannot tell it from an operator's ``kill -9``.
    """
    for path in instance_cgroup_dirs(name):
        for filename in ("memory.events", "memory.oom_control"):
            try:
                text = (path / filename).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def own_cgroup_line(pid: int) -> str:
    """``/proc/<pid>/cgroup`` as text ("" when the process is gone): where the kernel placed it."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""
