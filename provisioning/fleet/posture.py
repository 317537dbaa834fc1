"""The isolation posture: one line per boundary between an instance and everything that is not its own.

Each line says whether the boundary holds here (``pass``), holds only partly or not for every
instance (``degraded``), or does not hold (``fail``), and how to fix it. The same lines feed
``manage.py check --deploy`` (``provisioning/checks.py``: a warning per degraded line, an error per
failed one), ``manage.py isolation_posture`` (the whole table) and the dashboard's isolation page.

Where a boundary can be probed cheaply it is probed, not inferred from configuration: a Redis
is asked to answer without a password, bubblewrap is asked to build a sandbox, the database
server's own ``pg_hba_file_rules`` are read. A configuration can say anything; what the server
accepts is what an attacker meets.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError

__all__ = ["PostureLine", "PASS", "DEGRADED", "FAIL", "isolation_posture", "redis_answers_without_password"]

PASS, DEGRADED, FAIL = "pass", "degraded", "fail"

# Control-plane settings whose values no instance may ever be given (INSTANCE_EXTRA_ENV is operator-set).
_CONTROL_PLANE_ONLY = ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL", "HEARTBEAT_REDIS_URL", "SECRET_KEY",
                       "VAULT_KEK_KEYRING", "TENANT_DATABASE_URL")


@dataclass(frozen=True)
class PostureLine:
    boundary: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _separation_line() -> PostureLine:
    from django.db import connection

    from provisioning.drivers.pg_admin import admin_conninfo

    own, tenant = connection.get_connection_params(), admin_conninfo()
    shared = all(str(own.get(k) or "") == str(tenant.get(k) or "") for k in ("host", "port", "dbname"))
    if shared:
        return PostureLine("database separation", DEGRADED,
                           f"tenant schemas live in the control plane's own database {own.get('dbname')}: every "
                           "tenant role may connect to it and list its tables (not read them)",
                           "set TENANT_DATABASE_URL to a database of its own (the embedded default does)")
    return PostureLine("database separation", PASS, f"tenant schemas live in {tenant.get('dbname')}, not in the "
                                                     "control plane's database")


def _database_lines() -> list[PostureLine]:
    from provisioning.drivers.pg_auth import database_posture

    try:
        return [PostureLine(**line) for line in database_posture()] + [_separation_line()]
    except Exception as exc:  # a server that does not answer is a finding, not a crash of the check
        return [PostureLine("database auth", FAIL, f"could not read the tenant database server's rules: "
                                                   f"{type(exc).__name__}", "make TENANT_DATABASE_URL reachable")]


@functools.lru_cache(maxsize=1)
def _bwrap_probe() -> str:
    """Empty if bubblewrap can build the namespaces the sandbox uses here; else what it said."""
    try:
        done = subprocess.run(
            [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/",
             "--proc", "/proc", "--dev", "/dev", "--", "true"],
            capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return type(exc).__name__
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")[:200]


def _degraded_instances() -> list[str]:
    from django.db import DatabaseError

    from provisioning.choices import ResourceKind
    from provisioning.models import ProvisionedResource

    try:
        rows = ProvisionedResource.objects.filter(kind=ResourceKind.RUNTIME, details__isolation="degraded") \
            .exclude(tenant__status="deleted").values_list("tenant__slug", flat=True)
        return sorted(rows)
    except DatabaseError:  # not migrated yet (a fresh deploy's check): no instance can be degraded
        return []


def _identity_lines() -> list[PostureLine]:
    from provisioning.drivers.local_sandbox import sandbox_support

    if settings.PROVISIONING_PROFILE != "local":
        return [PostureLine("OS identity", PASS, "one namespace and service account per tenant (Kubernetes)"),
                PostureLine("sandbox", PASS, "restricted pods, default-deny network policy per namespace")]
    ok, reason = sandbox_support()
    degraded = _degraded_instances()
    fix_start = "restart them (dashboard: Restart instance) once the control plane runs as root with bubblewrap"
    if not ok:
        fix = ("run the worker as root with `bubblewrap` installed (Debian: apt-get install bubblewrap), "
               "or use the Kubernetes profile")
        return [PostureLine("OS identity", DEGRADED, f"instances share the control plane's user: {reason}", fix),
                PostureLine("sandbox", DEGRADED, "instances run without a sandbox", fix)]
    probe = _bwrap_probe()
    identity = (PostureLine("OS identity", DEGRADED, f"{len(degraded)} instance(s) still run without their own "
                                                     f"user: {', '.join(degraded[:5])}", fix_start)
                if degraded else PostureLine("OS identity", PASS, "each local instance runs as its own uid"))
    sandbox = (PostureLine("sandbox", FAIL, f"bubblewrap cannot build a sandbox here: {probe}",
                           "allow PID/IPC namespaces for the control plane (container: --privileged or a "
                           "seccomp profile that permits clone(CLONE_NEWPID)), or LOCAL_INSTANCE_ISOLATION=off")
               if probe else
               PostureLine("sandbox", PASS, "bubblewrap: own PID/IPC namespaces and /proc, read-only runtime, "
                                            "private /tmp, other tenants and var/ hidden"))
    return [identity, sandbox]


def _private(path: Path) -> str:
    """Empty if ``path`` (and, for a directory, its files) is readable by its owner only; else why not."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return ""
    if info.st_uid != os.geteuid():
        return f"{path} belongs to uid {info.st_uid}, not the control plane's"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{path} has mode {stat.S_IMODE(info.st_mode):o}"
    if path.is_dir():
        for entry in path.iterdir():
            if entry.is_file() and stat.S_IMODE(entry.stat().st_mode) & 0o077:
                return f"{entry} has mode {stat.S_IMODE(entry.stat().st_mode):o}"
    return ""


def _secrets_line() -> PostureLine:
    var = Path(settings.VAR_DIR)
    problems = [p for p in (_private(var / "secrets"), _private(var / "log")) if p]
    if problems:
        return PostureLine("secrets", FAIL, "; ".join(problems),
                           f"chmod -R go-rwx {var / 'secrets'} {var / 'log'}")
    return PostureLine("secrets", PASS, "the secrets directory and the control plane's logs are private to "
                                        "its user (and hidden from every sandbox)")


def redis_answers_without_password(url: str, *, timeout: float = 1.0) -> bool | None:
    """Ask the Redis server at ``url`` for PING with no credentials: True if it answers, None if unreachable.
    A unix socket URL (``unix://...``, kombu's ``redis+socket://...``: the embedded Redis) is asked on its socket."""
    parts = urlsplit(url)
    if parts.scheme == "rediss":
        return None  # a TLS Redis is not probed in clear text; its URL's credentials are checked instead
    unix = parts.scheme in ("unix", "redis+socket", "socket")
    try:
        with (socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) if unix else
              socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=timeout)) as sock:
            if unix:
                sock.settimeout(timeout)
                sock.connect(parts.path)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = sock.recv(64)
    except OSError:
        return None
    return reply.startswith(b"+PONG")


def _broker_lines() -> list[PostureLine]:
    urls = {"broker": str(settings.CELERY_BROKER_URL), "heartbeats": str(settings.HEARTBEAT_REDIS_URL or ""),
            "cache": str(settings.CACHES["default"].get("LOCATION", "")
                         if "redis" in settings.CACHES["default"]["BACKEND"].lower() else "")}
    lines = []
    for use, url in urls.items():
        if not url:
            continue
        parts = urlsplit(url)
        where = (f"the unix socket {parts.path}" if parts.scheme in ("unix", "redis+socket", "socket")
                 else f"{parts.scheme}://{parts.hostname}:{parts.port or ''}")
        if parts.scheme.startswith("redis") or parts.scheme == "unix":
            open_server = redis_answers_without_password(url)
            if open_server:
                lines.append(PostureLine(f"{use} auth", FAIL, f"the Redis at {where} answers without a password",
                                         "set requirepass (or an ACL user) on the server and put it in the URL: "
                                         "redis://:<password>@host:6379/0"))
            elif not parts.password:
                lines.append(PostureLine(f"{use} auth", DEGRADED, f"{where}: the URL carries no password",
                                         "redis://<user>:<password>@host:6379/0"))
            else:
                lines.append(PostureLine(f"{use} auth", PASS, f"{where} requires a password"))
        elif parts.scheme in ("amqp", "pyamqp", "amqps"):
            weak = (parts.username or "guest") == "guest"
            lines.append(PostureLine(f"{use} auth", DEGRADED if weak else PASS,
                                     f"{where}: " + ("the default guest account" if weak else "its own account"),
                                     "a RabbitMQ user of the control plane's own" if weak else ""))
    return lines


def _environment_line() -> PostureLine:
    extra = dict(settings.INSTANCE_EXTRA_ENV)
    secrets_here = {name: str(os.environ.get(name) or getattr(settings, name, "") or "")
                    for name in _CONTROL_PLANE_ONLY}
    leaked = sorted({k for k in extra if k in _CONTROL_PLANE_ONLY}
                    | {name for name, value in secrets_here.items()
                       if len(value) >= 8 and any(value in v for v in extra.values())})
    if leaked:
        return PostureLine("instance environment", FAIL, f"INSTANCE_EXTRA_ENV hands instances {', '.join(leaked)}",
                           "remove them from INSTANCE_EXTRA_ENV: instances reach the control plane only through "
                           "its internal API with their own token")
    return PostureLine("instance environment", PASS, "instances get their own tenant's values only (no control "
                                                     "plane database, broker or key)")


def _identity_range_line() -> PostureLine:
    """How many numeric identities are issued and how many remain: a uid is never issued twice."""
    from provisioning.models import InstanceIdentity

    if settings.PROVISIONING_PROFILE != "local":
        return PostureLine("identity range", PASS, "one namespace and service account per tenant (Kubernetes)")
    base = settings.LOCAL_INSTANCE_UID_BASE
    try:
        last = InstanceIdentity.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    except DatabaseError as exc:
        return PostureLine("identity range", FAIL, f"cannot read the identity records: {exc.__class__.__name__}",
                           "migrate the control plane's database")
    left = 2**32 - 2 - (base + last) - 1
    status = PASS if base >= 65536 and left > 100_000 else DEGRADED
    return PostureLine("identity range", status, f"uids from {base} (no /etc/passwd entries, never reused): {last} "
                                                 f"issued, {left} left",
                       "" if status == PASS else "LOCAL_INSTANCE_UID_BASE at 1048576 (above every login user)")


def _address_line() -> PostureLine:
    """Control 3f: where the control plane sends an instance's calls. A property of the code, not of this machine's
    configuration, so nothing to probe: the line says what holds, for the profile in use."""
    if settings.PROVISIONING_PROFILE != "local":
        return PostureLine("instance address", PASS, "instances are called at the Service the driver created, never at "
                                                     "an address the instance wrote")
    return PostureLine("instance address", PASS, "a port an instance publishes is called only while the kernel shows "
                                                 "that tenant's own host listening on it; other addresses are refused "
                                                 "and audited")


def _network_line() -> PostureLine:
    """The network boundary: a namespace per instance (``LOCAL_INSTANCE_NETWORK``, ``auto`` where the machine can, or
    ``isolated``), or the machine's, shared with every loopback service (counted: what a sandbox in it reaches; the
    inside probe says which answer), with the reason it is shared."""
    from provisioning.drivers.local_network import listening_loopback_ports
    from provisioning.drivers.local_sandbox import sandbox_support
    from provisioning.drivers.local_support import network_choice

    if settings.PROVISIONING_PROFILE != "local":
        return PostureLine("network", PASS, "default-deny NetworkPolicy per tenant namespace (Kubernetes)")
    fix = ("install socat and leave LOCAL_INSTANCE_NETWORK=auto (or set isolated): each sandboxed instance gets a "
           "network namespace of its own and reaches only its database, the internal API, its S3 endpoint and the "
           "egress proxy (docs/security.md)")
    ok, reason = sandbox_support()
    if not ok:
        return PostureLine("network", DEGRADED, f"instances share the machine's network (no sandbox: {reason})", fix)
    isolated, why_shared = network_choice(str(settings.LOCAL_INSTANCE_NETWORK),
                                          str(settings.LOCAL_INSTANCE_ISOLATION))
    if isolated:
        # The proxy's address only: the credential each instance sends is in its own environment, never here.
        egress = (f"the internet only through the egress proxy at {settings.EGRESS_PROXY_ADDRESS} (each tenant's "
                  "allow-list, by its instance token)" if settings.EGRESS_PROXY_ADDRESS
                  else "no internet at all (EGRESS_PROXY_ADDRESS unset: no egress proxy granted)")
        granted = (f"; and, granted by the staff, the loopback {', '.join(settings.LOCAL_INSTANCE_LOOPBACK_GRANTS)}"
                   if settings.LOCAL_INSTANCE_LOOPBACK_GRANTS else "")
        return PostureLine("network", PASS, "isolated: each sandboxed instance has a network namespace of its own "
                                            "(only its loopback) and reaches only its database, the internal API "
                                            "and its S3 endpoint, each through a unix socket the driver binds into "
                                            f"it; {egress}{granted}")
    ports = listening_loopback_ports()
    return PostureLine("network", DEGRADED, f"shared ({why_shared}): instances keep the machine's network namespace; "
                                            f"{len(ports)} TCP port(s) listen on its loopback, reachable from every "
                                            "instance", fix)


def _limits_line() -> PostureLine:
    """Resource limits per plan: whether this machine can give a sandboxed instance its cgroup (probed by making
    and removing one, since a mounted controller can still refuse a child: a read-only or undelegated tree)."""
    from provisioning.drivers.local_limits import cgroup_layout, instance_cgroup_dirs, remove_instance_cgroup
    from provisioning.drivers.local_sandbox import sandbox_support

    if settings.PROVISIONING_PROFILE != "local":
        return PostureLine("resource limits", PASS, "ResourceQuota and LimitRange per namespace from the plan")
    fix = ("run the control plane as root where the memory, pids and cpu cgroup controllers are mounted writable "
           "(v1, or v2 with them delegated: LOCAL_INSTANCE_CGROUP_PARENT), or use the Kubernetes profile")
    ok, reason = sandbox_support()
    if not ok:
        return PostureLine("resource limits", DEGRADED, f"instances run without limits of their own: {reason}", fix)
    layout = cgroup_layout()
    probe = "posture-probe"
    try:
        for path in instance_cgroup_dirs(probe, layout):
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return PostureLine("resource limits", FAIL, f"cannot make an instance cgroup here: {exc}", fix)
    finally:
        remove_instance_cgroup(probe)
    if not layout.parents:
        return PostureLine("resource limits", FAIL, f"no instance cgroups here: {layout.reason}", fix)
    return PostureLine("resource limits", PASS, f"each sandboxed instance in its own cgroup (v{layout.version}): its "
                                                "plan's memory (OOM kill, recovered as `oom`), pids and CPU; "
                                                "RLIMIT_NPROC and RLIMIT_FSIZE as a second line")


def _disk_line() -> PostureLine:
    """Disk per plan: new volumes as images of the plan's storage, where this machine can loop-mount them."""
    from provisioning.drivers.local_sandbox import sandbox_support
    from provisioning.drivers.local_volume_image import image_support

    if settings.PROVISIONING_PROFILE != "local":
        return PostureLine("disk quota", PASS, "one PersistentVolumeClaim of the plan's storage per tenant")
    if settings.LOCAL_VOLUME_QUOTA == "off":
        return PostureLine("disk quota", DEGRADED, "LOCAL_VOLUME_QUOTA=off: volumes share the disk (one tenant can "
                                                   "fill it)", "LOCAL_VOLUME_QUOTA=auto")
    for ok, reason in (sandbox_support(), image_support()):
        if not ok:
            return PostureLine("disk quota", DEGRADED, f"volumes share the disk: {reason}",
                               "run the control plane as root with loop devices, or use the Kubernetes profile")
    return PostureLine("disk quota", PASS, "each new volume is an ext4 image of its plan's storage, loop-mounted "
                                           "(ENOSPC for that tenant only); volumes made before stay directories")


def isolation_posture() -> list[PostureLine]:
    """Every boundary, in the order an attacker holding one instance would try them."""
    return [*_identity_lines(), _identity_range_line(), _limits_line(), _disk_line(), _secrets_line(),
            _environment_line(), _address_line(), _network_line(),
            *_database_lines(), *_broker_lines(), *_inside_lines()]


def _inside_lines() -> list[PostureLine]:
    """What an instance reaches, probed from inside a real sandbox (``posture_inside``; cached a minute)."""
    from provisioning.fleet.posture_inside import inside_lines_cached

    return inside_lines_cached()


def posture_as_data() -> list[dict[str, Any]]:
    return [line.as_dict() for line in isolation_posture()]
