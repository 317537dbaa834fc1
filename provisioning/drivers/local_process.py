"""Runtime driver for the local profile: the tenant's ``agent-host`` as a detached subprocess.

The process gets only its own tenant's settings in a minimal environment (never the
control plane's DATABASE_URL, SECRET_KEY or key ring) and, where the control plane runs
as root, its own OS user inside a bubblewrap sandbox (``local_sandbox``). Its pid (the
host process itself, not the sandbox around it) lives in ``<volume>/.host/instance.pid`` (the
runtime's own ``pid`` file holds its pid inside the sandbox's PID namespace); ``ensure``
reuses a live process instead of starting a second one, and the runtime itself refuses to
run two writers on one schema.

An instance given an operator's release (``spec.release``) runs that release's agents from the release's
install directory, bound read-only into its sandbox; ``ensure`` replaces a live host that runs another
release (a graceful stop, then a start) instead of reusing it. A container image release is refused: there is
nothing here to run it with.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings

from controlplane.errors import ProvisioningError
from provisioning.recovery import exit_notice
from provisioning.resources import contributions

from ..choices import ReleaseArtifact
from .base import Observed, Ref, TenantSpec
from .local_fork import PLACEHOLDER_ARGV, find_placeholder, fork_enabled, fork_host, forked_host_in
from .local_limits import (
    cgroup_enter_argv,
    ensure_instance_cgroup,
    instance_cgroup_dirs,
    oom_kills,
    plan_limits,
    rlimit_argv,
)
from .local_network import (
    INSIDE_DIR,
    connect_in_namespace,
    ensure_relays,
    instance_grants,
    isolated_environment,
    network_isolated,
    stop_relays,
)
from .local_sandbox import DEGRADED, SANDBOXED, Isolation, ensure_instance_user, give_to_instance, sandboxed_argv
from .pg_admin import tenant_conninfo, tenant_pooled
from .protocols import Capability, RuntimeDriver

__all__ = ["LocalProcessDriver", "PID_FILE", "instance_environment", "instance_command", "is_tenant_process",
           "live_host_pid", "oom_killed", "open_instance_connection",
           "published_address", "published_port", "recorded_host_pids", "release_environment",
           "volume_host_dir"]

HOST_MODULE = "agent_runtime.host"
# The control plane's record of the host's pid as this machine sees it (``services.py stop`` and the tests read it).
PID_FILE = "instance.pid"
log = logging.getLogger(__name__)
# How long ensure() waits for the sandbox to exec the host (bwrap, then setpriv, then python).
_SANDBOX_EXEC_WAIT_S = 10.0


def instance_environment(spec: TenantSpec) -> dict[str, str]:
    """The complete environment of a tenant's instance: its own resources and nothing else."""
    db = spec.resources["database"].details
    return {
        **settings.INSTANCE_EXTRA_ENV,
        "AGENT_TENANT_ID": spec.tenant_id,
        "AGENT_SCHEMA": db["schema"],
        "AGENT_DATABASE_URL": tenant_conninfo(
            role=db["role"], password=spec.secrets["db_password"], schema=db["schema"], server=spec.database_server
        ),
        "AGENT_DATABASE_POOLED": "1" if tenant_pooled(spec.database_server) else "0",
        "AGENT_VOLUME": spec.resources["volume"].details["path"],
        "AGENT_OBJECTSTORE_URL": spec.resources["objectstore"].details["url"],
        "AGENT_OBJECT_KEY": spec.secrets["object_key_b64"],
        "AGENT_OBJECT_KEYS_PREVIOUS": spec.secrets.get("object_keys_previous_b64", ""),
        "AGENT_INSTANCE_TOKEN": spec.secrets.get("instance_token", ""),
        "AGENT_CONTROL_PLANE_URL": settings.CONTROL_PLANE_INTERNAL_URL,
        # Where ensure() sends the process's output: GET /v1/logs reads its tail.
        "AGENT_LOG_FILE": str(_host_dir(spec) / "agent-host.log"),
        # Traces also go to the operator's collector when one is set (docs/observability.md).
        **({"OTEL_EXPORTER_OTLP_ENDPOINT": settings.INSTANCE_OTLP_ENDPOINT} if settings.INSTANCE_OTLP_ENDPOINT else {}),
    }


def volume_host_dir(volume_path: str | Path) -> Path:
    """The host's own directory in a tenant's volume: its pid file, its published port, its log."""
    return Path(volume_path) / ".host"


def _host_dir(spec: TenantSpec) -> Path:
    return volume_host_dir(spec.resources["volume"].details["path"])


def _release(spec: TenantSpec) -> tuple[str, str, Path] | None:
    """The release the spec asks for as (version, digest, install directory), or None for the runtime's agents."""
    if not spec.release:
        return None
    version, digest, env = (str(spec.release.get(k, "")) for k in ("version", "digest", "env"))
    if spec.release.get("image"):
        raise ProvisioningError(f"release {version} is a container image ({spec.release['image']}): local instances "
                                "run a wheel's install directory; image releases run on the Kubernetes profile")
    if not (version and digest.startswith("sha256:") and env and Path(env).is_absolute()):
        raise ProvisioningError(f"the release given for the instance is incomplete (version {version!r}, digest "
                                f"{digest!r}, env {env!r}): it needs a version, a sha256: digest and an absolute path")
    # Resolved: the path the instance is told is the one bound into its sandbox (a symlink inside the hidden var/
    # would lead nowhere there).
    return version, digest, Path(env).resolve()


def _install_here(version: str, digest: str, env: Path) -> None:
    """Make the release's install directory on this machine when it is missing (the registered installer fetches
    the wheel from the control plane's object store and checks its digest); ProvisioningError when it cannot."""
    if env.is_dir():
        return
    try:
        installable = contributions.release_install(digest)
    except ProvisioningError as exc:
        raise ProvisioningError(f"release {version} ({digest}) is not installed on this machine and cannot be "
                                f"installed: {exc}") from None
    if not installable or not env.is_dir():
        raise ProvisioningError(f"release {version} ({digest}) is not installed on this machine: {env} does not "
                                "exist")


def _install_retained(spec: TenantSpec) -> None:
    """The retained releases made here too (best effort: one that cannot be is left out, as before)."""
    try:
        items = json.loads(spec.release.get("retained") or "[]")
    except ValueError:
        return
    for item in items:
        digest, env = str(item.get("digest", "")), str(item.get("env", ""))
        if digest.startswith("sha256:") and env and Path(env).is_absolute():
            try:
                _install_here(str(item.get("version", "")), digest, Path(env))
            except ProvisioningError as exc:
                log.warning("a retained release cannot be installed here: the instance runs without it",
                            extra={"event": "release_retained_missing", "digest": digest, "error": str(exc)})


def _retained(spec: TenantSpec) -> list[dict[str, str]]:
    """The earlier releases the instance keeps loadable (``spec.release["retained"]``), as the host reads them
    (``AGENT_RELEASES_RETAINED``): installed ones only, each path resolved as it is bound into the sandbox."""
    try:
        items = json.loads(spec.release.get("retained") or "[]")
    except ValueError:
        return []
    out = []
    for item in items:
        if not item.get("digest") and not item.get("env"):  # the runtime's own agents, installed with it
            out.append({"version": "", "digest": "", "path": ""})
            continue
        path = Path(str(item.get("env", ""))).resolve()
        if str(item.get("digest", "")).startswith("sha256:") and path.is_absolute() and path.is_dir():
            out.append({"version": str(item.get("version", "")), "digest": str(item["digest"]), "path": str(path)})
    return out


def release_environment(spec: TenantSpec) -> dict[str, str]:
    """The variables that make a local instance load its release (none without one), and the earlier releases
    its unfinished tasks may have started on.

    Kept out of ``instance_environment``: the Kubernetes driver's Secret is built from that, and there the release
    is the instance's image, not a directory on the control plane's machine.
    """
    release = _release(spec)
    if release is None:
        return {}
    version, digest, env = release
    retained = _retained(spec)
    # The kinds the release declared at upload: the host imports those entry points only, and refuses to start
    # ready if the installed release does not provide one (the record and the install disagree).
    kinds = str(spec.release.get("kinds", ""))
    return {"AGENT_RELEASE_PATH": str(env), "AGENT_RELEASE_VERSION": version, "AGENT_RELEASE_DIGEST": digest,
            **({"AGENT_KINDS": kinds} if kinds else {}),
            **({"AGENT_RELEASES_RETAINED": json.dumps(retained)} if retained else {})}


def _writable_paths(spec: TenantSpec) -> list[Path]:
    """The tenant's own volume (first: the working directory) and its local object-store prefix."""
    paths = [Path(spec.resources["volume"].details["path"])]
    objectstore = spec.resources.get("objectstore")
    url = str(objectstore.details.get("url", "")) if objectstore is not None else ""
    if url.startswith("file://"):
        paths.append(Path(urllib.request.url2pathname(url[len("file://"):])).resolve())
    return paths


def instance_command(
    spec: TenantSpec, argv: list[str], isolation: Isolation | None = None,
) -> tuple[list[str], dict[str, str]]:
    """``argv`` as the tenant's instance runs it: its sandbox and uid, and its whole environment.

    ``agent-host`` and its CLI (task submission) both go through here, so nothing of the
    instance ever runs as the control plane's user where a sandbox is possible, and, sandboxed, everything of it
    runs inside its cgroup with its plan's rlimits (``local_limits``): the CLI's processes count against the same
    memory and pids as the host they serve.
    """
    isolation = isolation or ensure_instance_user(spec)
    release = _release(spec)
    if release is not None:
        _install_here(*release)
        _install_retained(spec)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        # The release's modules import from its install directory, after the runtime's source tree.
        "PYTHONPATH": os.pathsep.join([str(settings.BASE_DIR), *([str(release[2])] if release else [])]),
        "PYTHONUNBUFFERED": "1",
        **instance_environment(spec),
        **release_environment(spec),
    }
    readable = [release[2], *(Path(r["path"]) for r in _retained(spec) if r["path"])] if release else []
    if isolation.mode != SANDBOXED:
        return sandboxed_argv(isolation, argv, writable=_writable_paths(spec), readable=readable), env
    granted = None
    if network_isolated():
        # Its own network namespace: only the destinations granted, through relays the driver keeps (the
        # environment pointing at them is rewritten here, never by the tenant).
        grants = instance_grants(env)
        granted = (ensure_relays(spec.resource_name, grants, isolation), INSIDE_DIR)
        env = isolated_environment(env, grants)
    limits = plan_limits(spec.plan)
    cgroups = ensure_instance_cgroup(spec.resource_name, limits)
    wrapped = sandboxed_argv(isolation, argv, writable=_writable_paths(spec), readable=readable,
                             rlimits=rlimit_argv(limits), granted=granted)
    return cgroup_enter_argv(cgroups, wrapped), env


def _is_tenant_host(pid: int, tenant_id: str) -> bool:
    """True for a live agent-host of this tenant (checked by its environment: pids get reused)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            try:
                os.waitpid(pid, os.WNOHANG)  # reap our own dead child
            except ChildProcessError:
                pass
            return False
        # The host itself (``python -m agent_runtime.host``), not the bwrap/setpriv around it whose
        # arguments name the module too.
        return proc.cmdline()[1:3] == ["-m", HOST_MODULE] and proc.environ().get("AGENT_TENANT_ID") == tenant_id
    except psutil.Error:
        return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie child of ours is reaped and counts as exited)."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.Error:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return False


def _running_release_digest(pid: int) -> str | None:
    """The ``AGENT_RELEASE_DIGEST`` the live host ``pid`` was started with ("" for the runtime's own agents), or
    None when it cannot be read (the process is gone)."""
    try:
        return psutil.Process(pid).environ().get("AGENT_RELEASE_DIGEST", "")
    except psutil.Error:
        return None


def _sandbox_host(pid: int, tenant_id: str, *, wait_s: float = 0.0) -> int | None:
    """The tenant's host inside the sandbox process ``pid`` (bwrap), waiting up to ``wait_s`` for it.

    The pid file first names the sandbox (written right after it is spawned, so a worker killed
    a moment later leaves a findable instance, never an orphan), then the host once it runs.

    Right after the spawn ``/proc/<pid>/environ`` can still lack the tenant's id: ``Popen`` returns once the
    child has released its old memory in ``execve``, before the kernel has laid out the new environment. On a
    busy machine that window is seen (``make demo`` with both cores taken): it means "not started yet", not
    "someone else's process", so it is waited for like the host itself. A pid that never shows the tenant's
    environment (reused by another program) still ends as None at the deadline.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sandbox = psutil.Process(pid)
            if sandbox.status() == psutil.STATUS_ZOMBIE:
                return None
            if sandbox.environ().get("AGENT_TENANT_ID") == tenant_id:
                children = sandbox.children(recursive=True)
                for child in children:
                    if _is_tenant_host(child.pid, tenant_id):
                        return child.pid
                # A forked host (LOCAL_INSTANCE_LAUNCH=fork) is the fork server's child, in the sandbox's PID namespace.
                forked = forked_host_in([c.pid for c in children], lambda p: _is_tenant_host(p, tenant_id))
                if forked is not None:
                    return forked
        except psutil.Error:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def recorded_host_pids(volume_path: str | None, runtime_details: Mapping[str, Any] | None) -> list[int]:
    """Where a tenant's host pid is recorded, freshest first: the pid file ``ensure`` writes as it spawns (the
    sandbox, then the host), then the runtime resource's record (written once it is ready; the one left when the
    volume was lost). No check that either is alive: ``live_host_pid`` and the exit watcher each do theirs."""
    pids: list[int] = []
    if volume_path:
        try:
            pids.append(int((volume_host_dir(volume_path) / PID_FILE).read_text().strip()))
        except (OSError, ValueError):
            pass
    recorded = (runtime_details or {}).get("pid")
    if recorded and int(recorded) not in pids:
        pids.append(int(recorded))
    return pids


def is_tenant_process(pid: int, tenant_id: str) -> bool:
    """Whether ``pid`` runs with the tenant's instance environment: its host, or the sandbox around it (which has
    the same environment). Another program under a reused pid, a zombie or a pid gone is not."""
    try:
        return psutil.Process(pid).environ().get("AGENT_TENANT_ID") == tenant_id
    except psutil.Error:
        return False


def live_host_pid(spec: TenantSpec) -> int | None:
    """The tenant's running agent-host: from the pid file, or the recorded pid if the volume was lost."""
    volume, runtime = spec.resources.get("volume"), spec.resources.get("runtime")
    candidates = recorded_host_pids(str(volume.details.get("path", "")) if volume is not None else None,
                                    runtime.details if runtime is not None else None)
    for pid in candidates:
        if _is_tenant_host(pid, spec.tenant_id):
            return pid
        host = _sandbox_host(pid, spec.tenant_id, wait_s=_SANDBOX_EXEC_WAIT_S)
        if host is not None:
            # Found through the sandbox the record still names (a start cut short after the spawn: its worker
            # killed). The file must name the host itself from now on, or the port it publishes is never
            # looked for in the right place (``published_port`` starts from it); not only ``ensure`` reads it:
            # a resumed rollout adopts such an instance without starting it again.
            with contextlib.suppress(OSError):  # the volume gone meanwhile: the answer still stands
                LocalProcessDriver._write_pid(_host_dir(spec), host)
            return host
    return None


# Addresses a listening socket may hold for a connection to 127.0.0.1:<port> to reach it. Not "::": a v6-only socket
# there leaves 127.0.0.1:<port> to someone else, and a socket on 127.0.0.2 or ::1 is not the one we would call.
_LOOPBACK_LISTEN = frozenset({"127.0.0.1", "0.0.0.0", "::ffff:127.0.0.1"})  # noqa: S104 - matched, not bound
# (host dir, pid, port) already refused and audited: a tenant that keeps its rewrite in place is one audit row, not
# one per call the control plane tries (a row per distinct attempt, logged every time).
_refused: set[tuple[str, int, int]] = set()


# What the last full check of each tenant's published (pid, port) found (keyed by the tenant too: B's verified
# address is no answer for A's files naming it): the process holding the listening socket, its
# start time, the socket's descriptor number and what that descriptor pointed to ("socket:[inode]").
_verified: dict[tuple[str, int, int], tuple[int, float, int, str]] = {}


def _listening_sockets(pid: int) -> list[tuple[int, str, int]]:
    """(descriptor, address, port) of each listening TCP socket process ``pid`` holds, read in *its* network namespace
    (``/proc/<pid>/net/tcp*``; psutil reads the caller's, where an isolated instance's sockets do not exist)."""
    inodes: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes[link[8:-1]] = int(fd)
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            rows = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != "0A" or fields[9] not in inodes:  # 0A: TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
            found.append((inodes[fields[9]], socket.inet_ntop(family, raw), int(port, 16)))
    return found


def _remember_holder(tenant_id: str, candidate: int, port: int, proc: psutil.Process, fd: int) -> None:
    """Keep what ``_still_held`` compares with. The descriptor is read, the process's sockets scanned again and
    the descriptor read again: the same inode before and after a scan that shows that descriptor listening on the
    port is the listening socket (a descriptor closed and reused in between would show another inode)."""
    if fd < 0:
        return
    key = (tenant_id, candidate, port)
    try:
        before = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
        listening = any(c_fd == fd and c_port == port for c_fd, _ip, c_port in _listening_sockets(proc.pid))
        if listening and os.readlink(f"/proc/{proc.pid}/fd/{fd}") == before:
            _verified[key] = (proc.pid, proc.create_time(), fd, before)
            return
    except (OSError, psutil.Error):
        pass
    _verified.pop(key, None)


def _still_held(tenant_id: str, candidate: int, port: int) -> bool:
    """Whether the socket a full check found is still open in the same process (one ``readlink`` and one ``stat``
    instead of the full check's scan of the process tree's environments and sockets).

    A bound socket never changes its port and a listening one keeps listening until it is closed; a closed
    descriptor is gone or points to another inode, and a pid reused by another process has another start time.
    So the same process holding the same inode at the same descriptor still holds the port: a socket closed and
    its port retaken by anyone else fails this and gets the full check again.
    """
    seen = _verified.get((tenant_id, candidate, port))
    if seen is None:
        return False
    pid, started, fd, link = seen
    try:
        if os.readlink(f"/proc/{pid}/fd/{fd}") == link and psutil.Process(pid).create_time() == started:
            return True
    except (OSError, psutil.Error):
        pass
    _verified.pop((tenant_id, candidate, port), None)
    return False


def _port_holder(candidate: int, port: int, tenant_id: str) -> tuple[int | None, str]:
    """The tenant's host process that holds the listening socket ``127.0.0.1:port``, and otherwise why not.

    ``candidate`` (the pid in ``.host/instance.pid``) is only a hint where to look: the tenant's uid owns that
    file. What counts is the kernel: the process itself must run with this tenant's instance environment (its
    host, or the sandbox around it: then the socket is looked for among the sandbox's children), and one of those
    processes must hold the listening socket a connection to 127.0.0.1:<port> reaches. The web server, another
    tenant's host or a database never has this tenant's environment, and this tenant's host cannot hold a socket
    on a port someone else listens on.
    """
    if not is_tenant_process(candidate, tenant_id):
        return None, "the recorded pid is not a process of this tenant's instance"
    try:
        procs = [psutil.Process(candidate)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return None, "the recorded pid exited"
    for proc in procs:
        try:
            if not _is_tenant_host(proc.pid, tenant_id):
                continue
            for fd, ip, listen_port in _listening_sockets(proc.pid):
                if listen_port == port and ip in _LOOPBACK_LISTEN:
                    _remember_holder(tenant_id, candidate, port, proc, fd)
                    return proc.pid, ""
        except (OSError, psutil.Error):
            continue
    return None, "no process of this tenant's instance listens on that port"


def _audit_port_refused(tenant_id: str, *, pid: int, port: int, reason: str) -> None:
    """An audit row for the tenant whose published address named something not its own (a cross-tenant attempt:
    the address would have sent the control plane's signed request to itself, a database or another instance)."""
    from tenants.actors import SYSTEM
    from tenants.audit import AuditAction, audit_record
    from tenants.models import Tenant

    tenant = Tenant.objects.filter(pk=tenant_id).first()
    if tenant is None:
        return
    audit_record(actor=SYSTEM, action=AuditAction.SECURITY_CROSS_TENANT_ATTEMPT, tenant=tenant,
                 data={"resource": "instance-port", "port": port, "pid": pid, "reason": reason})


def published_port(host_dir: Path, tenant_id: str) -> int | None:
    """The port tenant ``tenant_id``'s instance published, if its own host listens on it (``published_address``)."""
    address = published_address(host_dir, tenant_id)
    return address[1] if address is not None else None


class PortNotPublished(ConnectionRefusedError):
    """The instance has published no port its own host listens on: it is not running (or not yet)."""


def open_instance_connection(host_dir: Path, tenant_id: str, *, timeout: float) -> socket.socket:
    """A TCP connection to the instance's API, wherever it listens: on the machine's loopback (shared network) or
    on its own namespace's (isolated), entered through the tenant's verified process. OSError when it cannot
    (``PortNotPublished`` when no verified port is published)."""
    address = published_address(host_dir, tenant_id)
    if address is None:
        raise PortNotPublished("no http port published yet (or not one the host listens on)")
    pid, port = address
    return connect_in_namespace(pid, port, timeout=timeout)


def published_address(host_dir: Path, tenant_id: str) -> tuple[int, int] | None:
    """(pid of its host, port) tenant ``tenant_id``'s instance published in ``.host/http-port``, if its own host
    listens on it (the pid: whose network namespace the port is in).

    Both files under ``.host`` are the instance's to rewrite (its uid owns the directory), so on their own they
    could name any loopback port and pid (the control plane's web server, a database, tenant B's host) and send
    our signed requests there. The port is believed only when the kernel shows this tenant's own host holding the
    listening socket (``_port_holder``). That full check costs milliseconds (the sandbox's processes, their
    environments and sockets); later calls for the same recorded (pid, port) only confirm that the same process
    still holds the same socket (``_still_held``, microseconds), since a socket can be closed and its port taken by
    someone else between two calls. A refusal is logged
    ``instance_port_refused`` and audited ``security.cross_tenant_attempt`` once per distinct (pid, port).
    """
    try:
        port = int((host_dir / "http-port").read_text().strip())
        pid = int((host_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if _still_held(tenant_id, pid, port):
        return pid, port
    holder, reason = _port_holder(pid, port, tenant_id)
    if holder is not None:
        return holder, port
    log.warning("instance published an address that is not its own host's: refused", extra={
        "event": "instance_port_refused", "port": port, "pid": pid, "tenant_id": tenant_id, "reason": reason})
    key = (str(host_dir), pid, port)
    if key not in _refused and _alive(pid):
        # A pid gone is a host that exited (a crash, a stop): not an attempt, only a stale file.
        _refused.add(key)
        _audit_port_refused(tenant_id, pid=pid, port=port, reason=reason)
    return None


def oom_killed(spec: TenantSpec) -> bool:
    """Whether the kernel's OOM killer has killed in the instance's cgroup since its host was started (the count
    ``ensure`` recorded then, ``oom_kills_at_start``, against the cgroup's now).

    A host gone with this true died of its plan's memory: SIGKILL alone cannot tell that from an operator's
    ``kill -9``. A probe or CLI of the same instance killed for memory counts too (it spends the same budget).
    """
    runtime = spec.resources.get("runtime")
    recorded = (runtime.details if runtime is not None else {}).get("oom_kills_at_start")
    if recorded is None:
        return False
    now = oom_kills(spec.resource_name)
    return now is not None and now > int(recorded)


def _http_get(host_dir: Path, tenant_id: str, path: str) -> tuple[int, dict[str, Any], str]:
    """GET ``path`` on the instance: (status, JSON body, detail); status 0 when it could not be asked.

    The body of a refusal is kept: /readyz says there why the host is not ready (its agents failed to load).
    """
    port = published_port(host_dir, tenant_id)
    if port is None:
        return 0, {}, "no http port published yet (or not one the host listens on)"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.sock = open_instance_connection(host_dir, tenant_id, timeout=2)
        conn.request("GET", path)
        resp = conn.getresponse()
        raw = resp.read(65536)
    except (OSError, http.client.HTTPException) as exc:
        return 0, {}, f"{path} unreachable: {exc.__class__.__name__}"
    finally:
        conn.close()
    if resp.status == 200:
        return 200, {}, f"http://127.0.0.1:{port}"
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    return resp.status, body if isinstance(body, dict) else {}, f"{path} answered {resp.status}"


def _http_ok(host_dir: Path, tenant_id: str, path: str) -> tuple[bool, str]:
    code, _body, detail = _http_get(host_dir, tenant_id, path)
    return code == 200, detail


def _running_isolation(pid: int, isolation: Isolation) -> Isolation:
    """What the live host really runs as: one started before sandboxing (a reused process) is degraded."""
    if isolation.mode != SANDBOXED:
        return isolation
    try:
        uid = psutil.Process(pid).uids().real
    except psutil.Error:
        return isolation
    if uid == isolation.uid:
        return isolation
    return Isolation(mode=DEGRADED, reason=f"running as uid {uid} since before its sandbox: restart the instance")


def _exited(proc: psutil.Process, *, timeout: float) -> bool:
    """Wait until the process has exited. A process that has exited but is another process's child stays a
    zombie until that parent reaps it (the host started by a worker, stopped from the web or a command):
    ``psutil.wait`` would wait for the reaping, here the exit is what counts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
            proc.wait(timeout=min(0.2, max(deadline - time.monotonic(), 0.01)))
            return True
        except psutil.NoSuchProcess:
            return True
        except (psutil.TimeoutExpired, ChildProcessError):
            pass
        if time.monotonic() >= deadline:
            return False


class LocalProcessDriver(RuntimeDriver):
    name = "local-process"
    capabilities = frozenset({Capability.PRESENT, Capability.STOP, Capability.SLEEP, Capability.PUBLISH_BRANDING})
    release_artifact = ReleaseArtifact.WHEEL

    def ensure(self, spec: TenantSpec) -> Ref:
        release = _release(spec)  # a release this driver cannot run is refused before anything is made
        host_dir = _host_dir(spec)
        host_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        isolation = ensure_instance_user(spec)
        for path in _writable_paths(spec):
            give_to_instance(path, isolation)
        version, digest = (release[0], release[1]) if release else ("", "")
        pid = live_host_pid(spec)
        if pid is not None:
            # The file names the host itself (``live_host_pid`` rewrites one naming its sandbox; here also when it
            # was found through the runtime record because the file was missing), or its port is never believed.
            self._write_pid(host_dir, pid)
            running = _running_release_digest(pid)
            if running is not None and running != digest:
                # Reusing it would leave the instance on code the spec no longer names (a release change, a
                # rollback): checked before the stop, so a release that cannot start never costs a running host.
                self._check_installed(release)
                log.info("the instance runs another release: replacing it", extra={
                    "event": "instance_release_replace", "pid": pid, "running_digest": running,
                    "wanted_digest": digest})
                if not self.stop(spec, grace_s=settings.RUNTIME_STOP_GRACE_S):
                    log.warning("the replaced instance did not stop within its grace period and was killed",
                                extra={"event": "instance_release_replace_killed", "pid": pid})
                pid = None
            elif running is None:
                pid = None  # exited since it was found: start one
        if pid is None:
            self._check_installed(release)
            (host_dir / "http-port").unlink(missing_ok=True)
            if isolation.mode == SANDBOXED and fork_enabled():
                pid = self._start_forked(spec, host_dir, isolation)
            else:
                pid = self._start_exec(spec, host_dir, isolation)
        endpoint = self._wait_ready(spec, pid)
        kills = oom_kills(spec.resource_name) if isolation.mode == SANDBOXED else None
        return Ref(external_id=f"local-process:{pid}", details={
            "pid": pid, "endpoint": endpoint, "release_version": version, "release_digest": digest,
            **({"oom_kills_at_start": kills} if kills is not None else {}),
            **_running_isolation(pid, isolation).as_details()})

    def _start_exec(self, spec: TenantSpec, host_dir: Path, isolation: Isolation) -> int:
        """``python -m agent_runtime.host`` exec'd in the sandbox (``LOCAL_INSTANCE_LAUNCH=exec``); the host's pid."""
        argv, env = instance_command(spec, [sys.executable, "-m", HOST_MODULE], isolation)
        log_file = open(host_dir / "agent-host.log", "ab")  # noqa: SIM115 - handed to the child
        with log_file:
            give_to_instance(host_dir / "agent-host.log", isolation, recursive=False)
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=host_dir.parent,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._write_pid(host_dir, proc.pid)
        exit_notice.watch(proc, spec.tenant_id)  # its parent hears of its exit at once (recovery in seconds)
        if argv[0] != sys.executable:  # sandboxed: record the host itself once it runs
            pid = _sandbox_host(proc.pid, spec.tenant_id, wait_s=_SANDBOX_EXEC_WAIT_S)
            if pid is None:
                raise ProvisioningError(
                    f"the instance sandbox did not start agent-host ({self._log_tail(host_dir)})")
            self._write_pid(host_dir, pid)
        else:
            pid = proc.pid
        return pid

    def _start_forked(self, spec: TenantSpec, host_dir: Path, isolation: Isolation) -> int:
        """The host forked from the fork server into a placeholder's sandbox (``LOCAL_INSTANCE_LAUNCH=fork``,
        ``local_fork``); the host's pid. The sandbox is the exec launch's, built by the same ``instance_command``."""
        argv, env = instance_command(spec, list(PLACEHOLDER_ARGV), isolation)
        # The sandbox process shows only who it is for (``is_tenant_process``); the secrets go to the host alone.
        shown = ("PATH", "LANG", "AGENT_TENANT_ID", "AGENT_RELEASE_DIGEST")
        sandbox_env: dict[str, str] = {k: env[k] for k in shown if k in env}
        lifeline_read, lifeline_write = os.pipe()
        log_file = open(host_dir / "agent-host.log", "ab")  # noqa: SIM115 - handed to the children
        try:
            give_to_instance(host_dir / "agent-host.log", isolation, recursive=False)
            proc = subprocess.Popen(argv, env=sandbox_env, cwd=host_dir.parent, stdin=lifeline_read,
                                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True)
            os.close(lifeline_read)
            self._write_pid(host_dir, proc.pid)
            exit_notice.watch(proc, spec.tenant_id)  # the sandbox ends with the host (the lifeline): heard at once
            placeholder = find_placeholder(proc.pid, int(isolation.uid or 0))
            if placeholder is None:
                raise ProvisioningError(
                    f"the instance sandbox did not start its placeholder ({self._log_tail(host_dir)})")
            pid = fork_host(placeholder=placeholder, uid=int(isolation.uid or 0), gid=int(isolation.gid or 0),
                            cgroups=instance_cgroup_dirs(spec.resource_name), env=env, log_fd=log_file.fileno(),
                            lifeline_fd=lifeline_write)
        finally:
            os.close(lifeline_write)  # only the host holds it now: its exit is the sandbox's end
            log_file.close()
        self._write_pid(host_dir, pid)
        return pid

    @staticmethod
    def _check_installed(release: tuple[str, str, Path] | None) -> None:
        """A release whose install directory is missing here is installed from the object store (``var/`` is a
        cache); one that cannot be cannot start, said before anything is spawned."""
        if release is not None:
            _install_here(*release)

    @staticmethod
    def _write_pid(host_dir: Path, pid: int) -> None:
        tmp = host_dir / f"{PID_FILE}.tmp"
        tmp.write_text(str(pid))
        tmp.replace(host_dir / PID_FILE)

    def _wait_ready(self, spec: TenantSpec, pid: int) -> str:
        host_dir = _host_dir(spec)
        deadline = time.monotonic() + settings.RUNTIME_READY_TIMEOUT_S
        detail = ""
        while time.monotonic() < deadline:
            if not _is_tenant_host(pid, spec.tenant_id) and not _alive(pid):
                # Only an exit counts: a live pid that does not show the host's command line and environment yet
                # is still inside execve (seen on a busy machine), and one that never does ends at the deadline.
                raise ProvisioningError(f"agent-host exited during start ({self._log_tail(host_dir)})")
            code, body, detail = _http_get(host_dir, spec.tenant_id, "/readyz")
            if code == 200:
                return detail
            if code == 503 and body.get("error"):
                # Its agents failed to load (a broken release, say): the host stays up and not ready until it is
                # restarted with other code, so waiting out the timeout would only hide the cause.
                raise ProvisioningError(f"agent-host is up but cannot load its agents: {str(body['error'])[:500]}")
            time.sleep(0.1)
        raise ProvisioningError(f"agent-host did not become ready in time: {detail}")

    @staticmethod
    def _log_tail(host_dir: Path) -> str:
        try:
            lines = (host_dir / "agent-host.log").read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return "no log"
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("level") in ("error", "ERROR", "critical"):
                return str(record.get("msg") or record.get("message") or record.get("event"))[:300]
        # No structured error: the process died before logging (an import error, the sandbox refusing).
        return lines[-1][:300] if lines else "empty agent-host.log"

    def present(self, spec: TenantSpec) -> bool:
        """Whether the tenant's process exists at all (alive, stopped or hung), without probing it."""
        return live_host_pid(spec) is not None

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        host_dir = _host_dir(spec)
        if live_host_pid(spec) is None:
            return Observed(exists=False, healthy=False, detail="agent-host is not running")
        ok, detail = _http_ok(host_dir, spec.tenant_id, "/healthz")
        return Observed(exists=True, healthy=ok, detail="" if ok else detail)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        self.stop(spec, grace_s=settings.RUNTIME_STOP_GRACE_S)

    def publish_branding(self, spec: TenantSpec, theme: dict) -> str:
        """Write the theme to ``<volume>/.host/branding.json`` atomically; returns the SHA-256 of the bytes."""
        body = json.dumps(theme, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
        host_dir = _host_dir(spec)
        host_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = host_dir / "branding.json.tmp"
        with open(tmp, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        owner = host_dir.stat()
        os.chown(tmp, owner.st_uid, owner.st_gid)  # the sandboxed instance's uid owns its .host
        tmp.replace(host_dir / "branding.json")
        return hashlib.sha256(body).hexdigest()

    def sleep(self, spec: TenantSpec, *, grace_s: float) -> bool:
        """Scale to zero: a plain stop (nothing restarts a local instance until ``ensure``)."""
        return self.stop(spec, grace_s=grace_s)

    def stop(self, spec: TenantSpec, *, grace_s: float) -> bool:
        """SIGTERM, wait up to ``grace_s`` for a clean exit, then SIGKILL. True if it exited cleanly."""
        host_dir = _host_dir(spec)
        pid = live_host_pid(spec)
        if pid is None:
            stop_relays(spec.resource_name)
            return True
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        clean = _exited(proc, timeout=grace_s)
        if not clean:
            proc.kill()
            if not _exited(proc, timeout=10):
                raise ProvisioningError(f"the instance process {pid} did not exit after SIGKILL")
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        (host_dir / PID_FILE).unlink(missing_ok=True)
        stop_relays(spec.resource_name)
        return clean
