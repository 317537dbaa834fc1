"""One OS identity and one bubblewrap sandbox per local instance.

Without this every ``agent-host`` runs as the worker's user: tenant A can read B's
``/proc/<pid>/environ`` (database password, instance token, object key), B's volume and the
control plane's secrets directory, and 0700 directories mean nothing. So, when the control
plane runs as root and ``bwrap`` and ``setpriv`` are installed, each tenant gets:

- a **numeric identity** of its own (uid = gid = ``LOCAL_INSTANCE_UID_BASE + n``, ``n`` from the
  ``InstanceIdentity`` sequence: never reused; no /etc/passwd entry, so no ~880-user ceiling of system
  uids), assigned at the first ensure; the volume and the tenant's object-store prefix are owned by it
  (mode 0700), so the kernel refuses every other tenant's uid. A tenant given an ``agt-<hash>`` system
  user before keeps it (its files are owned by that uid);
- a **bubblewrap sandbox**: its own PID, IPC and UTS namespaces and a private ``/proc`` (B's
  processes do not exist for A), a fresh ``/dev`` and ``/tmp``, the whole filesystem read-only,
  and ``/root``, ``/home``, ``/run``, ``/var/log``, the control plane's ``var/`` (secrets, logs,
  embedded database, every volume and object prefix) replaced by empty tmpfs; then the runtime
  (interpreter, virtualenv, source tree) and the operator's agent release the instance runs (its own
  install directory, none of the other releases') bound back read-only and the tenant's own volume and
  prefix bound back writable. ``setpriv`` drops to the tenant's uid with no capabilities, no
  supplementary groups and ``no_new_privs`` before the runtime starts.

Its resources are bounded by ``local_limits`` (a cgroup and rlimits of its plan, entered before bubblewrap
runs; the ``rlimits`` prefix goes inside the sandbox, before ``setpriv``) and its volume by
``local_volume_image``.

Wherever the machine can (``LOCAL_INSTANCE_NETWORK=auto``, the default: ``local_support.network_choice``), the
sandbox gets a network namespace of its own and only the sockets ``local_network`` grants (``own_network``,
``granted``). Shared (``shared``, or ``auto`` without ``socat``), the instance reaches its database and the control
plane's internal API over the machine's loopback, and what protects every loopback service is its authentication.

When the sandbox is impossible (not root, no ``bwrap``), the instance still starts as before and
the runtime resource records ``isolation: degraded`` with the reason; ``LOCAL_INSTANCE_ISOLATION
= required`` (and production) refuse that instead.
"""

from __future__ import annotations

import grp
import hashlib
import importlib.metadata
import json
import os
import pwd
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from controlplane.errors import ProvisioningError

from .base import TenantSpec
from .local_support import sandbox_missing

__all__ = [
    "Isolation", "sandbox_support", "instance_user_name", "ensure_instance_user", "instance_uid",
    "remove_instance_user", "give_to_instance", "sandboxed_argv", "untrusted_argv", "drop_privileges_argv",
    "SANDBOXED", "DEGRADED", "NOBODY",
]

# The runtime's agent discovery group (agent_runtime.host.loader; the control plane does not import the runtime).
AGENT_ENTRY_POINTS = "agent_runtime.agents"
SANDBOXED = "sandboxed"
DEGRADED = "degraded"
USER_PREFIX = "agt-"
# Paths no instance may see: homes, runtime sockets, system logs and scratch space. The control
# plane's own directories are added from settings (they may live anywhere).
_ALWAYS_HIDDEN = ("/root", "/home", "/run", "/var/log", "/var/tmp", "/tmp")  # noqa: S108 - hidden, not used


@dataclass(frozen=True)
class Isolation:
    """How one tenant's instance runs: sandboxed under its own uid, or degraded (and why)."""

    mode: str
    reason: str = ""
    user: str = ""
    uid: int | None = None
    gid: int | None = None

    def as_details(self) -> dict[str, str | int]:
        """What the runtime resource records (shown on the dashboard, the API and the posture page)."""
        details: dict[str, str | int] = {"isolation": self.mode}
        if self.reason:
            details["isolation_reason"] = self.reason
        if self.user:
            details["os_user"] = self.user
        if self.uid is not None:
            details["os_uid"] = self.uid
        return details


def sandbox_support() -> tuple[bool, str]:
    """Whether this process can sandbox instances; otherwise one sentence saying why not."""
    reason = sandbox_missing(str(settings.LOCAL_INSTANCE_ISOLATION))
    return not reason, reason


def instance_user_name(spec: TenantSpec) -> str:
    """The name of the system user a tenant was given before numeric identities (``useradd``): looked up so that
    such a tenant keeps the uid its files are owned by."""
    return USER_PREFIX + hashlib.sha256(spec.tenant_id.encode()).hexdigest()[:12]


def _lookup(name: str) -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def ensure_instance_user(spec: TenantSpec) -> Isolation:
    """The tenant's OS identity (assigned once) and how its instance will run.

    Refuses degraded isolation where it is required (``LOCAL_INSTANCE_ISOLATION=required`` or
    production), because there a silently shared uid would be a hole, not a fallback.
    """
    ok, reason = sandbox_support()
    if not ok:
        if settings.LOCAL_INSTANCE_ISOLATION == "required" or settings.PRODUCTION:
            raise ProvisioningError(f"instance isolation is required but impossible here: {reason}")
        return Isolation(mode=DEGRADED, reason=reason)
    name = instance_user_name(spec)
    legacy = _lookup(name)
    if legacy is not None:  # a system user made before numeric identities: its files are owned by its uid
        return Isolation(mode=SANDBOXED, user=name, uid=legacy[0], gid=legacy[1])
    uid = instance_uid(spec.tenant_id)
    return Isolation(mode=SANDBOXED, uid=uid, gid=uid)


def instance_uid(tenant_id: str) -> int:
    """The tenant's uid (= gid), assigned from the identity sequence at its first call and the same ever after."""
    from ..models import InstanceIdentity

    identity, _ = InstanceIdentity.objects.get_or_create(tenant_id=tenant_id)
    uid = settings.LOCAL_INSTANCE_UID_BASE + identity.pk
    if uid >= 2**32 - 2:  # (uid_t)-1 and -2 mean "no change" / overflow to the kernel
        raise ProvisioningError("the instance uid range is exhausted: lower LOCAL_INSTANCE_UID_BASE")
    return uid


def remove_instance_user(spec: TenantSpec) -> None:
    """Retire the tenant's identity (deprovision): a numeric one is marked released and never issued again; a
    system user made before numeric identities is deleted (a user that is already gone is not an error)."""
    from django.utils import timezone

    from ..models import InstanceIdentity

    InstanceIdentity.objects.filter(tenant_id=spec.tenant_id, released_at__isnull=True).update(
        released_at=timezone.now())
    name = instance_user_name(spec)
    if os.geteuid() != 0 or _lookup(name) is None or not shutil.which("userdel"):
        return
    subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)
    try:  # --user-group made a group of the same name; userdel removes it unless it is shared
        grp.getgrnam(name)
        subprocess.run(["groupdel", name], capture_output=True, timeout=30, check=False)
    except KeyError:
        pass


def give_to_instance(path: Path, isolation: Isolation, *, recursive: bool = True) -> None:
    """Make ``path`` (a volume, a prefix, a file the control plane wrote there) the tenant's own.

    Walks the tree only when the top is not owned yet (first sandboxed start of an instance whose
    files a shared-uid host wrote), so a steady-state ensure costs one ``stat``.
    """
    if isolation.mode != SANDBOXED or isolation.uid is None or isolation.gid is None or not path.exists():
        return
    uid, gid = isolation.uid, isolation.gid
    top = path.lstat()
    if top.st_uid == uid and top.st_gid == gid and not (recursive and path.is_dir() and _any_foreign(path, uid)):
        return
    os.chown(path, uid, gid, follow_symlinks=False)
    if recursive and path.is_dir():
        for root, dirs, files in os.walk(path):
            for entry in (*dirs, *files):
                os.chown(os.path.join(root, entry), uid, gid, follow_symlinks=False)


def _any_foreign(path: Path, uid: int) -> bool:
    """True if a direct child of ``path`` belongs to someone else (a file the control plane just wrote)."""
    try:
        return any(entry.stat(follow_symlinks=False).st_uid != uid for entry in os.scandir(path))
    except OSError:
        return False


def _hidden_paths() -> list[Path]:
    # The releases' installs too (under var/ by default, but RELEASES_ROOT may be set elsewhere): an instance sees
    # only the release it runs, bound back by ``sandboxed_argv``, never another operator's code.
    own = [settings.VAR_DIR, settings.LOCAL_VOLUME_ROOT, settings.LOCAL_OBJECTSTORE_ROOT, settings.RELEASES_ROOT]
    return [Path(p) for p in _ALWAYS_HIDDEN] + [Path(p).resolve() for p in own]


def _runtime_paths(hidden: list[Path]) -> list[Path]:
    """What ``python -m agent_runtime.host`` needs to read: interpreter, virtualenv, source, entry points.

    Only the outermost of nested paths, and never a hidden tree itself (``sys.path[0]`` may be
    the directory a script was started from, ``/tmp`` say). A path *containing* a hidden tree is
    fine (the checkout holding ``var/``): mounts go parents first, so the deeper tmpfs still hides it.
    """
    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(settings.BASE_DIR),
                  Path(os.path.realpath(sys.executable)).parent.parent}
    candidates.update(Path(p) for p in sys.path if p and Path(p).is_dir())
    candidates.update(_agent_package_dirs())
    resolved = {c.resolve() for c in candidates}
    # Not a hidden tree itself, and only what another user may enter at all (a 0700 directory on sys.path,
    # the cwd of a script say, would shadow the usable paths inside it and open nothing).
    resolved = {c for c in resolved if c not in hidden and c.stat().st_mode & 0o001}
    return sorted(c for c in resolved if not any(o != c and _under(c, o) for o in resolved))


def _agent_package_dirs() -> set[Path]:
    """Where the installed agents' code lives when it is outside the virtualenv: an editable install
    (``pip install -e``) keeps it in the project's directory, recorded in the distribution's
    ``direct_url.json`` (PEP 610). Read from metadata, so it works in a worker started before the install
    (whose import hooks never saw the package) and imports no agent code."""
    found: set[Path] = set()
    for entry_point in importlib.metadata.entry_points(group=AGENT_ENTRY_POINTS):
        dist = entry_point.dist
        raw = dist.read_text("direct_url.json") if dist is not None else None
        if not raw:
            continue
        try:
            direct = json.loads(raw)
        except ValueError:
            continue
        url = str(direct.get("url", ""))
        if direct.get("dir_info", {}).get("editable") and url.startswith("file://"):
            path = Path(urllib.request.url2pathname(url[len("file://"):]))
            if path.is_dir():
                found.add(path)
    return found


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def sandboxed_argv(isolation: Isolation, argv: list[str], *, writable: list[Path],
                   readable: Sequence[Path] = (), rlimits: Sequence[str] = (), own_network: bool = False,
                   granted: tuple[Path, Path] | None = None) -> list[str]:
    """``argv`` wrapped in the tenant's sandbox (or unchanged when isolation is degraded).

    Mounts are listed parents first, so a path hidden by a tmpfs can be bound back inside it:
    ``/`` read-only, then each hidden tree as an empty tmpfs, then the runtime and ``readable`` (the
    release the instance runs, which lives under ``var/``) read-only, then the tenant's own writable paths.
    A ``readable`` path is never writable: one that overlaps a writable path is refused, not mounted.
    ``rlimits``: a ``prlimit ... --`` prefix run inside the sandbox before ``setpriv`` (``local_limits``).
    ``own_network``: a network namespace of its own (``--unshare-net``: only its loopback), ``granted`` (outside
    directory, inside path) bound read-only into it: the sockets of what it may reach (``local_network``).
    """
    if isolation.mode != SANDBOXED:
        return argv
    for path in readable:
        clash = next((w for w in writable if _under(path, w) or _under(w, path)), None)
        if clash is not None:
            raise ProvisioningError(f"{path} must be read-only in the instance's sandbox, but it overlaps the "
                                    f"writable {clash}")
    hidden = [p for p in _hidden_paths() if p.exists()]
    mounts: list[tuple[int, int, list[str]]] = []
    for path in hidden:
        mounts.append((len(path.parts), 0, ["--tmpfs", str(path)]))
    for path in _runtime_paths(hidden):
        if any(_under(path, h) for h in hidden):
            mounts.append((len(path.parts), 1, ["--ro-bind", str(path), str(path)]))
    for path in readable:
        # Bound even where nothing hides it: the path the instance is told is the one it can read. A missing
        # source is bwrap's error ("Can't find source path"), not a silently empty release.
        mounts.append((len(path.parts), 1, ["--ro-bind", str(path), str(path)]))
    for path in writable:
        mounts.append((len(path.parts), 2, ["--bind", str(path), str(path)]))
    # bwrap makes the missing parents of a mount point 0700 (root's): the instance's uid must pass them.
    made: set[Path] = set()
    for _depth, _, args in list(mounts):
        target = Path(args[-1])
        root = max((h for h in hidden if _under(target, h) and h != target), key=lambda h: len(h.parts), default=None)
        if root is None:
            continue
        for parent in reversed(target.parents):
            if _under(parent, root) and parent != root and parent not in made:
                made.add(parent)
                mounts.append((len(parent.parts), -1, ["--perms", "0711", "--dir", str(parent)]))
    if granted is not None:
        mounts.append((len(granted[1].parts), 1, ["--ro-bind", str(granted[0]), str(granted[1])]))
    mounts.sort(key=lambda m: (m[0], m[1]))
    cwd = str(writable[0]) if writable else "/"
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--new-session",
        *(["--unshare-net"] if own_network or granted is not None else []),
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        *[arg for _, _, args in mounts for arg in args],
        "--chdir", cwd,
        "--",
        *rlimits,
        *drop_privileges_argv(isolation),
        *argv,
    ]


# Untrusted code the control plane runs that is no tenant's yet (an uploaded release's import check): the
# kernel's unprivileged user, in the same sandbox as an instance, with only its scratch directory writable.
NOBODY = Isolation(mode=SANDBOXED, user="nobody", uid=65534, gid=65534)


def untrusted_argv(argv: list[str], *, writable: list[Path]) -> tuple[list[str], Isolation]:
    """``argv`` sandboxed as ``nobody`` where this machine can sandbox, else unchanged and marked degraded
    (refused where isolation is required, as for instances)."""
    ok, reason = sandbox_support()
    if not ok:
        if settings.LOCAL_INSTANCE_ISOLATION == "required" or settings.PRODUCTION:
            raise ProvisioningError(f"running untrusted code needs the sandbox, impossible here: {reason}")
        return argv, Isolation(mode=DEGRADED, reason=reason)
    # With an isolated network (LOCAL_INSTANCE_NETWORK, auto or isolated) it gets no network at all (it is granted
    # nothing). Imported here: local_network imports this module.
    from .local_network import network_isolated

    wrapped = sandboxed_argv(NOBODY, argv, writable=writable, own_network=network_isolated())
    # Unlike an instance it must not outlive its caller: a timeout kills bwrap, and with it everything inside.
    return [wrapped[0], "--die-with-parent", *wrapped[1:]], NOBODY


def drop_privileges_argv(isolation: Isolation) -> list[str]:
    """``setpriv`` to the tenant's uid and gid: no supplementary groups, no capabilities, ``no_new_privs``."""
    return [
        shutil.which("setpriv") or "setpriv",
        "--reuid", str(isolation.uid), "--regid", str(isolation.gid), "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
        "--",
    ]
