"""Posture probes run from inside a real tenant sandbox (issue 38): what an instance can actually reach.

``posture.py`` probes the servers the control plane is configured with, from the control plane's side. An
attacker holding an instance meets something else: every service on the host's loopback (with
``LOCAL_INSTANCE_NETWORK`` shared the sandbox shares the host's network namespace; isolated, none),
whatever authentication each of them asks for, and whatever the sandbox leaves visible of other tenants. So
this module starts a sandbox exactly as an instance is started (a tenant's own:
``local_process.instance_command``, its cgroup, uid, rlimits and environment; or, with no tenant named, the
sandbox builder ``local_sandbox.sandboxed_argv`` as the unprivileged ``nobody``, as an uploaded release's check
runs) and runs ``PROBE`` in it. The probe is stdlib only (``python -I``) and speaks each protocol's first
message itself, so what it reports is what the server answered that process, not what a configuration says.

Kept apart from ``posture.py`` (which only appends these lines) so that the boundary table there stays small.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from provisioning.fleet.posture import DEGRADED, FAIL, PASS, PostureLine

__all__ = ["WELL_KNOWN_PORTS", "PROBE", "run_inside_probe", "inside_posture_lines", "inside_lines_cached"]

# Services an instance has no business talking to directly, by their usual port. The control plane's own ports
# are added from its settings (``_named_ports``).
WELL_KNOWN_PORTS = {5432: "PostgreSQL", 6432: "PgBouncer", 6379: "Redis", 5672: "RabbitMQ", 15672: "RabbitMQ admin",
                    3306: "MariaDB/MySQL", 1883: "MQTT (Mosquitto)", 4222: "NATS", 11211: "memcached",
                    27017: "MongoDB", 9200: "Elasticsearch", 25: "SMTP", 4369: "epmd (RabbitMQ)",
                    25672: "RabbitMQ cluster"}
# Data services whose reachability alone is a finding (an instance's database is reached through its own URL
# and role; the other data services it is never given).
_DATA_SERVICES = {"PostgreSQL", "PgBouncer", "Redis", "RabbitMQ", "RabbitMQ admin", "MariaDB/MySQL",
                  "MQTT (Mosquitto)", "NATS", "memcached", "MongoDB", "Elasticsearch", "epmd (RabbitMQ)",
                  "RabbitMQ cluster"}
_PROBE_TIMEOUT_S = 60
_CACHE_S = 60.0

# Runs inside the sandbox as the tenant (or nobody). Input: one JSON argument; output: one JSON line.
PROBE = r'''
import json, os, socket, struct, sys
cfg = json.loads(sys.argv[1])

def listening():
    ports = {}
    for name, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            rows = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = f[1].split(":")
            raw = bytes.fromhex(addr)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            host = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw)
            if host in ("0.0.0.0", "::", "127.0.0.1", "::1") or host.startswith("127.") or host == "::ffff:127.0.0.1":
                host = "::1" if host == "::1" else "127.0.0.1"
            ports.setdefault(int(port, 16), set()).add(host)
    return ports

def connects(host, port):
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False

def ask(port, payload, size=256):
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
        s.sendall(payload)
        return s.recv(size)

def pg_login(port, user):
    params = b"user\0" + user.encode() + b"\0database\0postgres\0\0"
    try:
        reply = ask(port, struct.pack("!ii", 8 + len(params), 196608) + params)
    except OSError as exc:
        return "unreachable: " + type(exc).__name__
    if reply[:1] == b"R" and len(reply) >= 9:
        code = struct.unpack("!i", reply[5:9])[0]
        return {0: "trust", 3: "password", 5: "md5", 10: "scram-sha-256"}.get(code, "auth %d" % code)
    if reply[:1] == b"E":
        return "refused"
    return "not PostgreSQL"

def redis_ping(port):
    try:
        reply = ask(port, b"*1\r\n$4\r\nPING\r\n", 64)
    except OSError as exc:
        return "unreachable: " + type(exc).__name__
    if reply.startswith(b"+PONG"):
        return "open"
    if b"NOAUTH" in reply or b"WRONGPASS" in reply or b"Authentication" in reply:
        return "auth"
    return "not Redis"

reachable = {}
for port, hosts in sorted(listening().items()):
    for host in sorted(hosts):
        if connects(host, port):
            reachable[port] = host
            break
postgres = {str(p): {role: pg_login(p, role) for role in cfg["roles"]}
            for p in cfg["postgres_ports"] if p in reachable}
redis = {str(p): redis_ping(p) for p in cfg["redis_ports"] if p in reachable}

me, own_tenant = os.getpid(), os.environ.get("AGENT_TENANT_ID", "")
ancestors, pid = set(), me
while pid > 1:
    try:
        pid = int([l for l in open("/proc/%d/status" % pid) if l.startswith("PPid:")][0].split()[1])
    except (OSError, IndexError, ValueError):
        break
    ancestors.add(pid)
processes, environments = [], []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == me or int(entry) in ancestors:
        continue
    try:
        cmd = open("/proc/%s/cmdline" % entry, "rb").read().replace(b"\0", b" ").decode(errors="replace")[:80]
        processes.append({"pid": int(entry), "uid": os.stat("/proc/" + entry).st_uid, "cmd": cmd})
        env = open("/proc/%s/environ" % entry, "rb").read()
    except OSError:
        continue
    for item in env.split(b"\0"):
        if item.startswith(b"AGENT_TENANT_ID=") and item[16:].decode() != own_tenant:
            environments.append({"pid": int(entry), "tenant": item[16:].decode()})
paths = [p for p in cfg["foreign_paths"] if os.path.exists(p)]
print(json.dumps({"uid": os.getuid(), "tenant": own_tenant, "reachable": {str(k): v for k, v in reachable.items()},
                  "postgres": postgres, "redis": redis, "processes": processes, "environments": environments,
                  "paths": paths}))
'''


def _port(url: str, default: int) -> int | None:
    parts = urlsplit(url)
    if not parts.scheme or parts.scheme.startswith("unix") or "socket" in parts.scheme:
        return None
    try:
        return parts.port or default
    except ValueError:
        return None


def _named_ports() -> dict[int, str]:
    """Well-known services by port, with the ports this control plane is configured with named after their use."""
    names = dict(WELL_KNOWN_PORTS)
    for setting, default, name in (("DATABASE_URL", 5432, "PostgreSQL"), ("TENANT_DATABASE_URL", 5432, "PostgreSQL"),
                                   ("CELERY_BROKER_URL", 6379, "Redis"), ("HEARTBEAT_REDIS_URL", 6379, "Redis"),
                                   ("CONTROL_PLANE_INTERNAL_URL", 80, "control plane (internal API)")):
        url = str(getattr(settings, setting, "") or os.environ.get(setting, "") or "")
        if setting == "CELERY_BROKER_URL" and url.startswith(("amqp", "pyamqp")):
            name, default = "RabbitMQ", 5672
        port = _port(url, default) if url else None
        if port:
            names[port] = name
    return names


def _probe_input(named: dict[int, str], foreign_paths: list[str], roles: list[str]) -> str:
    return json.dumps({"postgres_ports": sorted(p for p, n in named.items() if n in ("PostgreSQL", "PgBouncer")),
                       "redis_ports": sorted(p for p, n in named.items() if n == "Redis"),
                       "roles": roles, "foreign_paths": foreign_paths})


def _roles() -> list[str]:
    """Roles worth trying without a password: the superuser, the machine's root, the control plane's own user."""
    roles = ["postgres", "root"]
    for setting in ("DATABASE_URL", "TENANT_DATABASE_URL"):
        user = urlsplit(str(getattr(settings, setting, "") or "")).username
        if user and user not in roles:
            roles.append(user)
    return roles


def _other_tenants(own_tenant_id: str) -> list[str]:
    """Other tenants' volume paths (and the control plane's secrets directory), for the probe to look for."""
    from django.db import DatabaseError

    from provisioning.choices import ResourceKind
    from provisioning.models import ProvisionedResource

    paths = [str(Path(settings.VAR_DIR) / "secrets")]
    try:
        rows = ProvisionedResource.objects.filter(kind=ResourceKind.VOLUME).exclude(tenant__status="deleted") \
            .exclude(tenant_id=own_tenant_id or None).values_list("details", flat=True)[:50]
        for details in rows:
            if isinstance(details, dict) and details.get("path"):
                paths.append(str(details["path"]))
    except DatabaseError:
        pass
    return paths


def run_inside_probe(*, spec: Any = None, foreign_paths: list[str] | None = None) -> dict[str, Any]:
    """Run ``PROBE`` in a sandbox and return what it found.

    ``spec`` (a ``TenantSpec``): inside that tenant's own sandbox, exactly as its instance runs (cgroup, uid,
    rlimits, environment). Without: a fresh sandbox as ``nobody`` built by the same ``sandboxed_argv``.
    ``foreign_paths`` are added to the other tenants' volumes the probe looks for (a test's decoy).
    Raises ``RuntimeError`` with the probe's stderr when it does not answer.
    """
    from provisioning.drivers.local_process import instance_command
    from provisioning.drivers.local_sandbox import untrusted_argv

    paths = _other_tenants(spec.tenant_id if spec is not None else "")
    roles = _roles()
    if spec is not None and "database" in spec.resources:  # its own role, tried without the password it was given
        roles.append(str(spec.resources["database"].details.get("role", "")) or "postgres")
    config = _probe_input(_named_ports(), [*paths, *(foreign_paths or [])], roles)
    argv = [sys.executable, "-I", "-c", PROBE, config]
    with tempfile.TemporaryDirectory(prefix="posture-") as scratch:
        if spec is not None:
            command, env = instance_command(spec, argv)
        else:
            command, _ = untrusted_argv(argv, writable=[Path(scratch)])
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                              check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the probe did not answer (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _name(port: int, named: dict[int, str]) -> str:
    return f"{port} ({named[port]})" if port in named else str(port)


def lines_from_probe(found: dict[str, Any]) -> list[PostureLine]:
    """The posture lines for one probe's findings (pure: the tests feed it real probe output)."""
    named = _named_ports()
    reachable = sorted(int(p) for p in found["reachable"])
    who = f"uid {found['uid']}" + (f", tenant {found['tenant']}" if found.get("tenant") else "")
    network_fix = ("give instances a network of their own (socat installed and LOCAL_INSTANCE_NETWORK=auto or "
                   "isolated: only its database, the internal API, its S3 endpoint and the egress proxy reachable); "
                   "until then every service on loopback must ask for a password")
    data = [p for p in reachable if named.get(p) in _DATA_SERVICES]
    shown = ", ".join(_name(p, named) for p in reachable[:30]) + (" ..." if len(reachable) > 30 else "")
    if data:
        network = PostureLine("loopback services (inside)", FAIL,
                              f"from inside a sandbox ({who}) {len(reachable)} local TCP port(s) accept connections, "
                              f"data services among them: {shown}", network_fix)
    elif reachable:
        network = PostureLine("loopback services (inside)", DEGRADED,
                              f"from inside a sandbox ({who}) {len(reachable)} local TCP port(s) accept connections: "
                              f"{shown}", network_fix)
    else:
        network = PostureLine("loopback services (inside)", PASS, f"from inside a sandbox ({who}) no local TCP port "
                                                                  "accepts a connection")
    trusted = sorted(f"{role}@{port}" for port, roles in found["postgres"].items()
                     for role, how in roles.items() if how == "trust")
    asked = ", ".join(f"{port}: " + ", ".join(f"{r} {h}" for r, h in roles.items())
                      for port, roles in found["postgres"].items())
    if trusted:
        postgres = PostureLine("database trust (inside)", FAIL,
                               f"from inside a sandbox PostgreSQL logs in without a password as {', '.join(trusted)}",
                               "the instance can log in to PostgreSQL without a password: replace `trust` with "
                               "`scram-sha-256` in pg_hba.conf for host connections (the embedded server does), or "
                               "run the server off this host, or set LOCAL_INSTANCE_NETWORK=isolated")
    else:
        asked = asked or "no PostgreSQL reachable"
        postgres = PostureLine("database trust (inside)", PASS,
                               f"from inside a sandbox no role logs in without a password ({asked})")
    open_redis = sorted(port for port, how in found["redis"].items() if how == "open")
    if open_redis:
        redis = PostureLine("redis auth (inside)", FAIL,
                            f"from inside a sandbox the Redis on port(s) {', '.join(open_redis)} answers PING "
                            "without a password",
                            "the instance can reach Redis without a password: set a password (requirepass) "
                                        "or run the broker off this host, or set LOCAL_INSTANCE_NETWORK=isolated")
    else:
        redis = PostureLine("redis auth (inside)", PASS,
                            "from inside a sandbox no Redis answers without a password "
                            f"({', '.join(f'{p}: {h}' for p, h in found['redis'].items()) or 'none reachable'})")
    seen = [*(f"{p}" for p in found["paths"]),
            *(f"tenant {e['tenant']}'s environment (pid {e['pid']})" for e in found["environments"])]
    others = [p for p in found["processes"] if p["uid"] != found["uid"] and p["pid"] != 1]
    if seen:
        tenants = PostureLine("other tenants (inside)", FAIL, f"from inside a sandbox these are visible: "
                                                              f"{'; '.join(seen[:5])}",
                              "run instances sandboxed (root with bubblewrap) so other volumes, var/ and other "
                              "processes are hidden")
    elif others:
        tenants = PostureLine("other tenants (inside)", DEGRADED,
                              f"from inside a sandbox {len(others)} process(es) of other users are visible (no "
                              f"environment readable): {', '.join(str(p['pid']) for p in others[:5])}",
                              "a PID namespace per instance (bubblewrap --unshare-pid)")
    else:
        tenants = PostureLine("other tenants (inside)", PASS,
                              "from inside a sandbox no other tenant's volume, process or environment is visible, nor "
                              "the control plane's secrets")
    return [network, postgres, redis, tenants]


def inside_posture_lines(spec: Any = None) -> list[PostureLine]:
    """The inside-the-sandbox lines: probed for real where this machine sandboxes; otherwise one line saying why
    not (without a sandbox an instance shares the control plane's user and sees everything it sees)."""
    from provisioning.drivers.local_sandbox import sandbox_support

    if settings.PROVISIONING_PROFILE != "local":
        return [PostureLine("loopback services (inside)", PASS,
                            "not probed from inside: each tenant's namespace has a default-deny NetworkPolicy")]
    ok, reason = sandbox_support()
    if not ok:
        return [PostureLine("loopback services (inside)", DEGRADED,
                            f"not probed from inside a sandbox: {reason}; an instance reaches everything the "
                            "control plane reaches", "run the control plane as root with bubblewrap")]
    try:
        found = run_inside_probe(spec=spec)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return [PostureLine("loopback services (inside)", FAIL, f"the probe inside a sandbox failed: {exc}",
                            "run `manage.py isolation_posture` as root to see bubblewrap's error")]
    return lines_from_probe(found)


_cache: dict[str, tuple[float, list[PostureLine]]] = {}


def inside_lines_cached() -> list[PostureLine]:
    """``inside_posture_lines()`` at most once a minute per process: the dashboard's isolation page and
    ``check --deploy`` share it, and a sandbox costs a fraction of a second each time."""
    from provisioning.drivers.local_sandbox import sandbox_support

    key = f"{settings.PROVISIONING_PROFILE}:{sandbox_support()[0]}"
    hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < _CACHE_S:
        return hit[1]
    lines = inside_posture_lines()
    _cache[key] = (time.monotonic(), lines)
    return lines
