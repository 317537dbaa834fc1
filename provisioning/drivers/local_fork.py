"""``LOCAL_INSTANCE_LAUNCH=fork``: a local instance forked from the machine's fork server instead of exec'd.

An exec'd ``agent-host`` pays ~33 MiB of private memory for its imports; a child of the pre-imported fork server
(``agent_runtime.host.forkserver``) shares them copy-on-write. The sandbox is still built by the exec launch's own
code (``local_process.instance_command``: cgroup, bubblewrap, ``prlimit``, ``setpriv``), but what it runs is a
placeholder: a shell that holds the namespaces and the mount tree and waits on a *lifeline* pipe. The fork server's
child copies everything from that placeholder (see the server's docstring) and keeps the lifeline's write end open
for life, so the host's exit (SIGKILL included) ends the placeholder, bubblewrap (whose exit the driver's watcher
hears, as for an exec'd instance) and with it every process left in the sandbox.

The fork server never sees a tenant secret: the environment goes to the child in a memfd it reads after the fork.
This module holds the server's start and the launch request; no decision about when to use it (``local_process``).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from django.conf import settings

from controlplane.errors import ProvisioningError

__all__ = ["PLACEHOLDER_ARGV", "SERVER_MODULE", "fork_enabled", "fork_server_socket", "runtime_fingerprint",
           "ensure_fork_server", "find_placeholder", "fork_host", "fork_server_pids", "started_fork_servers",
           "forked_host_in"]

SERVER_MODULE = "agent_runtime.host.forkserver"
# Pure shell built-ins: nothing to load, ~1 MiB. Reads the lifeline (its stdin) until EOF: the host has exited.
PLACEHOLDER_ARGV = ["/bin/sh", "-c", "while read -r _; do :; done", "agent-host-placeholder"]
_START_WAIT_S = 30.0
_SUN_PATH_MAX = 107
# The servers this process started (``started_fork_servers``: a test session stops its own, wherever they listen).
_started: list[subprocess.Popen[bytes]] = []
_PLACEHOLDER_WAIT_S = 10.0


def fork_enabled() -> bool:
    """Whether sandboxed instances are forked (the setting); a degraded instance is always exec'd."""
    return str(settings.LOCAL_INSTANCE_LAUNCH) == "fork"


def _server_dir() -> Path:
    path = Path(settings.VAR_DIR) / "forkserver"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def runtime_fingerprint() -> str:
    """What the runtime's code is now (each source file's path, size and mtime under ``agent_runtime/``, and the
    interpreter): a fork server keeps the code it imported, so one started before an upgrade must not fork the
    instances started after it. Stats only (~200 files), never an import: the control plane never imports agents'
    code."""
    digest = hashlib.sha256(os.path.realpath(sys.executable).encode())
    root = Path(settings.BASE_DIR) / "agent_runtime"
    for path in sorted(root.rglob("*.py")):
        info = path.stat()
        digest.update(f"{path.relative_to(root)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def fork_server_socket() -> Path:
    """The socket of the fork server for the runtime as it is now: another code, another server. A server whose
    socket is gone exits once its last instance has (``agent_runtime.host.forkserver``)."""
    path = _server_dir() / f"forkserver-{runtime_fingerprint()}.sock"
    # A path socket, never an abstract one: any process in the machine's network namespace (an instance with a shared
    # network) could connect to that. So the path must fit sockaddr_un.
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise ProvisioningError(f"LOCAL_INSTANCE_LAUNCH=fork: the fork server's socket path {path} is longer than a "
                                f"unix socket allows ({_SUN_PATH_MAX} bytes): use a shorter VAR_DIR")
    return path


def _retire_other_servers(current: Path) -> None:
    for old in _server_dir().glob("forkserver-*.sock"):
        if old != current:
            old.unlink(missing_ok=True)


def _connect(path: Path, timeout: float) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def ensure_fork_server() -> Path:
    """The machine's fork server's socket, starting the server first when none answers (one at a time: a lock)."""
    path = fork_server_socket()
    probe = _connect(path, 1.0)
    if probe is not None:
        probe.close()
        return path
    with open(_server_dir() / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = _connect(path, 1.0)
        if probe is not None:
            probe.close()
            return path
        _retire_other_servers(path)
        # Tenant-free by construction: only what the interpreter needs to import the runtime.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8"),
               "PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1"}
        with open(_server_dir() / "forkserver.log", "ab") as log:
            _started.append(subprocess.Popen([sys.executable, "-m", SERVER_MODULE, str(path)], env=env, cwd="/",
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, close_fds=True))
        deadline = time.monotonic() + _START_WAIT_S
        while time.monotonic() < deadline:
            probe = _connect(path, 1.0)
            if probe is not None:
                probe.close()
                return path
            time.sleep(0.05)
    raise ProvisioningError(f"the fork server did not start (see {_server_dir() / 'forkserver.log'})")


def find_placeholder(sandbox_pid: int, uid: int, *, wait_s: float = _PLACEHOLDER_WAIT_S) -> int | None:
    """The placeholder inside the sandbox process ``sandbox_pid``, once it runs as the tenant's uid."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            for child in psutil.Process(sandbox_pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.cmdline() == PLACEHOLDER_ARGV and child.uids().real == uid:
                        return child.pid
        except psutil.Error:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def fork_host(*, placeholder: int, uid: int, gid: int, cgroups: list[Path], env: dict[str, str], log_fd: int,
              lifeline_fd: int) -> int:
    """Ask the fork server for the tenant's host in ``placeholder``'s sandbox; its pid as this machine sees it.

    ``env`` travels in a memfd the server passes on unread. ``lifeline_fd`` is the write end of the placeholder's
    stdin: the caller closes its own copy once this returns, so that only the host holds it.
    """
    path = ensure_fork_server()
    env_fd = os.memfd_create("instance-env", os.MFD_CLOEXEC)
    try:
        os.write(env_fd, json.dumps(env).encode())
        os.lseek(env_fd, 0, os.SEEK_SET)
        sock = _connect(path, settings.RUNTIME_READY_TIMEOUT_S)
        if sock is None:
            raise ProvisioningError("the fork server does not answer")
        with sock:
            request = json.dumps({"placeholder": placeholder, "uid": uid, "gid": gid,
                                  "cgroups": [str(c) for c in cgroups]}).encode()
            fds = array.array("i", [env_fd, log_fd, lifeline_fd])
            sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
    finally:
        os.close(env_fd)
    try:
        answer = json.loads(reply or b"{}")
    except ValueError:
        answer = {}
    if "pid" not in answer:
        raise ProvisioningError(f"the fork server could not start the instance: {answer.get('error', 'no answer')}")
    return int(answer["pid"])


def fork_server_pids(under: Path) -> list[int]:
    """The fork servers whose socket lies under ``under`` (a test session's ``var/``: the ones it started)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv[1:3] == ["-m", SERVER_MODULE] and len(argv) > 3 and Path(argv[3]).is_relative_to(under):
            found.append(proc.pid)
    return found


def started_fork_servers() -> list[int]:
    """The pids of the fork servers this process started that still run."""
    return [proc.pid for proc in _started if proc.poll() is None]


def _pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def forked_host_in(sandbox_pids: list[int], is_host: Callable[[int], bool]) -> int | None:
    """A host forked into the sandbox whose processes are ``sandbox_pids`` (bubblewrap's init, the placeholder): a
    process in their PID namespace that ``is_host`` accepts. For a record that still names the sandbox (a start cut
    short after the spawn), where an exec'd host would be found among the sandbox's children."""
    placeholders = []
    for pid in sandbox_pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).cmdline() == PLACEHOLDER_ARGV:
                placeholders.append(pid)
    if not placeholders:  # an exec'd sandbox (or one not started yet): no scan of the machine's processes
        return None
    spaces = {ns for ns in map(_pid_namespace, placeholders) if ns is not None}
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if proc.pid not in sandbox_pids and argv[1:2] == ["-m"] and _pid_namespace(proc.pid) in spaces \
                and is_host(proc.pid):
            return proc.pid
    return None
