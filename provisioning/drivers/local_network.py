"""A network namespace per sandboxed local instance (``LOCAL_INSTANCE_NETWORK``, issue 38).

Isolated (the default ``auto`` wherever the instance is sandboxed and ``socat`` is installed, or ``isolated``:
``local_support.network_choice``), bubblewrap gives the sandbox a namespace of its own (``--unshare-net``: nothing
but its own loopback), and the instance reaches exactly the destinations it is granted, each through a path the
control plane makes. Shared (``shared``, or ``auto`` where the machine cannot), the sandbox keeps the machine's
network namespace: every loopback service answers it and only each one's authentication stands between an instance
and it. The grants, isolated:

- outside, per instance and per destination, one ``socat`` listening on a unix socket in a root-owned directory
  (``<VAR_DIR>/net/<hash>/``) and connecting each accepted connection to that one host:port. ``socat`` is no Python
  process (about 1 MiB, asleep in ``accept``), it is started in a session of its own so it outlives the worker
  that started it (as the host does), ``ensure`` starts it again when it is gone and ``stop`` ends it;
- inside, that directory bound read-only at ``/run/agent-net``. The database is reached by libpq's own unix-socket
  support (``host=/run/agent-net``, socket ``.s.PGSQL.<port>``: no forwarder at all); HTTP clients that cannot speak
  unix sockets (the internal API, an S3 endpoint) get a listener on the sandbox's own loopback, at the
  destination's port, run as threads of ``agent-host`` (``agent_runtime.host.netforward``, from
  ``AGENT_NET_FORWARDS``) that block in ``accept``/``recv``;
- the control plane calls the instance's API in the instance's own namespace (``connect_in_namespace``: a socket
  made by a short-lived thread that entered the namespace of a process verified to be the tenant's): nothing else
  listens there, so no address the tenant writes can lead the call anywhere else.

Development adds one kind of grant: ``LOCAL_INSTANCE_LOOPBACK_GRANTS``, exact loopback ``ip:port`` destinations the
staff grants every instance (``make demo``: its local payment provider, SMTP sink, chat model, OAuth and MCP peers),
each one more relay reached inside at ``127.0.0.1:<port>``. The egress proxy keeps refusing private addresses
(its peers are the internet's); production refuses the setting.

Outbound internet (model provider, payments, SMTP, MCP, OAuth) goes through the machine's egress proxy
(``manage.py egress_proxy``, at ``EGRESS_PROXY_ADDRESS``) or nowhere: with that setting, one more grant
("egress") leads to the proxy, and ``egress_proxy_environment`` hands the instance ``HTTPS_PROXY``/``HTTP_PROXY`` at
its loopback end, the credential in the URL being the tenant id and the instance token it already holds (the proxy
verifies it as the internal API does and applies that tenant's allow-list). ``NO_PROXY`` keeps the granted internal
destinations (all at ``127.0.0.1`` inside) off the proxy. Without the setting an isolated instance has no way out.

No Django models here; settings only.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psutil
import psycopg
from django.conf import settings

from controlplane.errors import ProvisioningError

from .local_sandbox import Isolation
from .local_support import network_choice

__all__ = ["INSIDE_DIR", "Grant", "network_isolated", "instance_grants", "isolated_environment", "ensure_relays",
           "stop_relays", "stop_relays_in", "relay_dir", "egress_proxy_environment", "connect_in_namespace",
           "listening_loopback_ports"]

log = logging.getLogger(__name__)
# Where an instance finds its granted sockets (inside the sandbox; /run is an empty tmpfs there).
INSIDE_DIR = Path("/run/agent-net")
# The S3 endpoint variables the runtime reads (agent_runtime.state.s3_credentials).
_S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_CLONE_NEWNET = 0x40000000
_RELAY_WAIT_S = 5.0


@dataclass(frozen=True)
class Grant:
    """One destination an isolated instance may reach: its socket's name inside ``INSIDE_DIR`` and where it leads."""

    name: str
    socket_name: str
    host: str
    port: int


def network_isolated() -> bool:
    """Whether sandboxed instances get a namespace of their own here (``local_support.network_choice``)."""
    return network_choice(str(settings.LOCAL_INSTANCE_NETWORK), str(settings.LOCAL_INSTANCE_ISOLATION))[0]


def _loopback_grants() -> list[Grant]:
    """The staff's extra loopback destinations (``LOCAL_INSTANCE_LOOPBACK_GRANTS``: development only, the demo's
    peers; ``settings.py`` has checked each is a loopback ``ip:port`` and production refuses the setting), each one
    more relay like the database's, reached inside at ``127.0.0.1:<port>`` so the instance's URL stays the same."""
    grants = []
    for address in settings.LOCAL_INSTANCE_LOOPBACK_GRANTS:
        host, _, port = str(address).rpartition(":")
        grants.append(Grant(f"loopback-{port}", f"loopback-{port}.sock", host, int(port)))
    return grants


def _http_grant(name: str, url: str) -> Grant | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return Grant(name, f"{name}.sock", parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def instance_grants(env: Mapping[str, str]) -> list[Grant]:
    """What the instance whose environment is ``env`` may reach: its database server (or PgBouncer), the control
    plane's internal API, its S3 endpoint when it has one, the machine's egress proxy when there is one and the
    loopback destinations the staff granted every instance (``LOCAL_INSTANCE_LOOPBACK_GRANTS``, development only).
    Nothing else: no other loopback service, and the internet only through the proxy's allow-list."""
    grants: list[Grant] = []
    db = psycopg.conninfo.conninfo_to_dict(env["AGENT_DATABASE_URL"])
    host, port = str(db.get("host") or "127.0.0.1"), int(db.get("port") or 5432)
    if host.startswith("/"):
        raise ProvisioningError("LOCAL_INSTANCE_NETWORK=isolated needs the tenant database reached over TCP "
                                f"(host:port), not the unix socket directory {host}")
    grants.append(Grant("database", f".s.PGSQL.{port}", host, port))
    for name, url in (("control-plane", env.get("AGENT_CONTROL_PLANE_URL", "")),
                      *(("s3", env.get(v, "")) for v in _S3_ENDPOINT_VARIABLES)):
        grant = _http_grant(name, url) if url else None
        if grant is not None and all(g.name != name for g in grants):
            grants.append(grant)
    proxy = _egress_grant()
    if proxy is not None:
        grants.append(proxy)
    grants += _loopback_grants()
    ports = [g.port for g in grants if g.name != "database"]
    if len(ports) != len(set(ports)):
        raise ProvisioningError(f"two granted HTTP destinations share a port ({ports}): the instance's loopback "
                                "listeners are keyed by port")
    return grants


def _inside_url(url: str, grant: Grant) -> str:
    """``url`` pointed at the instance's own loopback listener for ``grant`` (same port, path and scheme)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"127.0.0.1:{grant.port}", parts.path, parts.query, parts.fragment))


def _egress_grant() -> Grant | None:
    """The path to the machine's egress proxy (``EGRESS_PROXY_ADDRESS``, ``host:port``), when there is one."""
    address = str(settings.EGRESS_PROXY_ADDRESS or "")
    if not address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ProvisioningError(f"EGRESS_PROXY_ADDRESS must be host:port, not {address!r}")
    return Grant("egress", "egress.sock", host.strip("[]") or "127.0.0.1", int(port))


def egress_proxy_environment(env: Mapping[str, str], grants: list[Grant]) -> dict[str, str]:
    """The variables that send an isolated instance's outbound HTTP(S) through the egress proxy: ``HTTPS_PROXY`` and
    ``HTTP_PROXY`` (and the lower-case spellings curl reads) at the loopback end of its "egress" grant, with the
    tenant id and instance token as the proxy credential (both already the instance's; urllib, requests, httpx and
    curl send them as ``Proxy-Authorization: Basic``), and ``NO_PROXY`` for the granted internal destinations.
    Empty without an egress grant: nothing leaves. The values hold a secret: never log them."""
    grant = next((g for g in grants if g.name == "egress"), None)
    if grant is None or not env.get("AGENT_INSTANCE_TOKEN"):
        return {}
    credential = f"{quote(env['AGENT_TENANT_ID'], safe='')}:{quote(env['AGENT_INSTANCE_TOKEN'], safe='')}"
    url = f"http://{credential}@127.0.0.1:{grant.port}"
    # Every granted internal destination is at 127.0.0.1 inside (``_inside_url``); ``localhost`` is left to the
    # proxy so a listed name that happens to be local (a test's peer) is still reached through it.
    internal = "127.0.0.1"
    return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
            "NO_PROXY": internal, "no_proxy": internal}


def isolated_environment(env: Mapping[str, str], grants: list[Grant]) -> dict[str, str]:
    """``env`` rewritten for the inside of an isolated sandbox (by the driver; the tenant writes none of it):
    the database over libpq's unix socket in ``INSIDE_DIR``, each HTTP destination at the instance's own loopback
    (same port) with ``AGENT_NET_FORWARDS`` telling ``agent-host`` which socket each listener forwards to."""
    out = dict(env)
    by_name = {g.name: g for g in grants}
    db = psycopg.conninfo.conninfo_to_dict(env["AGENT_DATABASE_URL"])
    db.pop("hostaddr", None)
    db.update(host=str(INSIDE_DIR), port=str(by_name["database"].port))
    out["AGENT_DATABASE_URL"] = psycopg.conninfo.make_conninfo("", **db)
    if "control-plane" in by_name:
        out["AGENT_CONTROL_PLANE_URL"] = _inside_url(env["AGENT_CONTROL_PLANE_URL"], by_name["control-plane"])
    for variable in _S3_ENDPOINT_VARIABLES:
        if env.get(variable) and "s3" in by_name:
            out[variable] = _inside_url(env[variable], by_name["s3"])
    out["AGENT_NET_FORWARDS"] = ",".join(f"{g.port}={INSIDE_DIR / g.socket_name}" for g in grants
                                         if g.name != "database")
    for variable in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy",
                     "NO_PROXY", "no_proxy"):
        out.pop(variable, None)  # the machine's own proxy settings lead nowhere from inside
    out.update(egress_proxy_environment(env, grants))
    return out


def relay_dir(resource_name: str) -> Path:
    """The instance's socket directory outside (short: a unix socket path has 107 bytes)."""
    return Path(settings.VAR_DIR) / "net" / hashlib.sha256(resource_name.encode()).hexdigest()[:16]


def _relay_argv(socket_path: Path, grant: Grant, isolation: Isolation) -> list[str]:
    return [shutil.which("socat") or "socat",
            f"UNIX-LISTEN:{socket_path},fork,unlink-early,user={isolation.uid},group={isolation.gid},mode=600",
            f"TCP:{grant.host}:{grant.port}"]


def _running_relay(pid_file: Path, argv: list[str]) -> bool:
    """Whether the pid file names a live socat with exactly ``argv`` (pids are reused)."""
    try:
        return psutil.Process(int(pid_file.read_text())).cmdline() == argv
    except (OSError, ValueError, psutil.Error):
        return False


def ensure_relays(resource_name: str, grants: list[Grant], isolation: Isolation) -> Path:
    """One live ``socat`` per grant for this instance (started when missing), its socket owned by the instance's
    uid (0600); returns the directory to bind at ``INSIDE_DIR``. Waits until every socket exists, so the host never
    boots before its database is reachable. A relay for a destination no longer granted is ended."""
    if not shutil.which("socat"):
        raise ProvisioningError("LOCAL_INSTANCE_NETWORK=isolated needs socat (Debian: apt-get install socat)")
    directory = relay_dir(resource_name)
    directory.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(directory, 0o711)  # noqa: S103 - the instance's uid passes it; only root writes it
    wanted = {g.name for g in grants}
    for stale in directory.glob("*.pid"):
        if stale.stem not in wanted:
            _end(stale)
    for grant in grants:
        socket_path, pid_file = directory / grant.socket_name, directory / f"{grant.name}.pid"
        argv = _relay_argv(socket_path, grant, isolation)
        if _running_relay(pid_file, argv) and socket_path.exists():
            continue
        _end(pid_file)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + _RELAY_WAIT_S
        while not socket_path.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ProvisioningError(f"the relay to {grant.name} ({grant.host}:{grant.port}) did not start")
            time.sleep(0.01)
        log.info("instance network relay started", extra={"event": "instance_relay_started", "grant": grant.name,
                                                          "pid": proc.pid, "resource": resource_name})
    return directory


def _end(pid_file: Path) -> None:
    """SIGTERM to the relay, waiting (up to 5 s) until it has exited: gone, or a zombie. A zombie has ended; its
    parent is whoever reaps it (pid 1 once the worker that started it is gone), and waiting for that reaping
    (``psutil.wait``) cost about 2 s per relay on this machine, 16 s per instance with the demo's grants."""
    try:
        proc = psutil.Process(int(pid_file.read_text()))
        if proc.name() == "socat":
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            with contextlib.suppress(psutil.Error):
                while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                    time.sleep(0.01)
    except (OSError, ValueError, psutil.Error):
        pass
    pid_file.unlink(missing_ok=True)


def stop_relays(resource_name: str) -> None:
    """End the instance's relays (its host stopped: the sockets lead nowhere until the next ``ensure``)."""
    stop_relays_in(relay_dir(resource_name))


def stop_relays_in(directory: Path) -> None:
    """End the relays whose pid files are in ``directory`` (one instance's)."""
    for pid_file in directory.glob("*.pid"):
        _end(pid_file)


def connect_in_namespace(pid: int, port: int, *, timeout: float) -> socket.socket:
    """A TCP connection to ``127.0.0.1:port`` as seen by process ``pid``: in its network namespace when that is not
    ours. ``pid`` must already be verified as the tenant's (``published_port``); nothing but the tenant's own
    processes lives in an isolated instance's namespace, so the address cannot lead anywhere else.

    The socket is made by a thread of its own that enters the namespace (``setns`` is per thread, and needs
    CAP_SYS_ADMIN: the control plane that sandboxes runs as root) and ends there; the socket keeps the namespace
    it was made in, and is connected from the caller's thread.
    """
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/net").st_ino, os.stat("/proc/self/ns/net").st_ino
    except OSError as exc:
        raise ConnectionError(f"the instance process {pid} is gone") from exc
    if theirs == ours:
        return socket.create_connection(("127.0.0.1", port), timeout=timeout)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the instance's network namespace failed")
            finally:
                os.close(fd)
            made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=enter, name="instance-netns", daemon=True)
    thread.start()
    thread.join()
    if failed or not made:
        raise ConnectionError(f"cannot enter the instance's network namespace: {failed[0] if failed else '?'}")
    sock = made[0]
    sock.settimeout(timeout)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def listening_loopback_ports() -> list[int]:
    """The TCP ports listening on this machine that a process in its network namespace reaches over loopback (what
    a sandbox in shared mode reaches)."""
    ports: set[int] = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and (
                conn.laddr.ip in ("0.0.0.0", "::", "::1", "::ffff:127.0.0.1") or conn.laddr.ip.startswith("127.")):  # noqa: S104
            ports.add(conn.laddr.port)
    return sorted(ports)
