"""A network namespace per sandboxed instance (issue 38, ``LOCAL_INSTANCE_NETWORK=isolated``), tried for real.

Two customers are onboarded by a real Celery worker started with the setting on; their instances run in their
sandboxes, each in a network namespace of its own, reaching their database (libpq over the granted unix socket,
``socat`` outside) and the live server's internal API (the host's loopback listener, forwarded to the granted
socket). One runs a task that needs both (its credential comes from the internal API) to done, and heartbeats
arrive. Then code started exactly as A's instance is (``instance_command``: its sandbox, uid, cgroup, environment)
connects to every TCP port listening on this machine, the machine's Redis and PostgreSQL, B's instance API and an
address outside: each fails. A's host killed with SIGKILL is recovered as any crash.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from provisioning.drivers.local_network import INSIDE_DIR, listening_loopback_ports, relay_dir, stop_relays_in
from provisioning.drivers.local_process import instance_command, live_host_pid
from provisioning.drivers.local_sandbox import sandbox_support
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance
from provisioning.recovery.exit_notice import on_exit
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import SESSION_TMP, kill_session_instances, onboard_ready, wait_for
from tests.provisioning.test_recovery import WORKER_ENV, _wait_recovered
from vault.services import credential_put

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("socat"),
                       reason="the sandbox needs root, bubblewrap and socat (make system-deps installs them)"),
]

EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_HEARTBEAT_INTERVAL_S": "0.5"}

# Runs inside A's sandbox; prints one JSON object: target -> "connected" or the errno name.
ATTACK = r'''
import errno, json, os, socket, sys
t = json.loads(sys.argv[1])

def connect(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc)) if exc.errno else type(exc).__name__
    finally:
        s.close()

def connect_listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))

out = {"ports": {str(p): connect("127.0.0.1", p) for p in t["ports"]},
       "ports_v6": {str(p): connect("::1", p, socket.AF_INET6) for p in t["ports"]},
       "machine_address": {str(p): connect(t["machine_ip"], p) for p in t["ports"]} if t["machine_ip"] else {},
       "outside": {a: connect(a, 443) for a in ("1.1.1.1", "8.8.8.8")},
       "granted_listing": connect_listing(t["inside_dir"]),
       "interfaces": sorted(n for _, n in socket.if_nameindex())}
print(json.dumps(out))
'''


@pytest.fixture(params=["exec", "fork"])
def isolated(request, live_server, worker_factory, settings, operator) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Two tenants' instances with networks of their own, launched each way (``LOCAL_INSTANCE_LAUNCH``)."""
    ok, why = sandbox_support()
    if not ok:
        pytest.fail(f"this machine cannot sandbox instances: {why}")
    settings.LOCAL_INSTANCE_NETWORK = "isolated"
    settings.VAR_DIR = SESSION_TMP / "var"  # the worker's (subprocess_env): one relay directory for both
    settings.HEARTBEAT_TIMEOUT_S = 120.0  # only the exit notice starts the recovery here
    env = {**WORKER_ENV, "LOCAL_INSTANCE_NETWORK": "isolated", "CONTROL_PLANE_INTERNAL_URL": live_server.url,
           "INSTANCE_EXTRA_ENV": json.dumps(EXTRA_ENV), "LOCAL_EXIT_NOTICE": "true", "HEARTBEAT_TIMEOUT_S": "120",
           "LOCAL_INSTANCE_LAUNCH": request.param}
    settings.LOCAL_INSTANCE_LAUNCH = request.param
    workers = [worker_factory(**env)]
    worker = workers[0]
    tenants: dict[str, Tenant] = {}
    try:
        try:
            for name in ("a", "b"):
                tenants[name] = onboard_ready(operator, f"net-{name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from None
        yield {**tenants, "worker": worker, "start_worker": lambda: workers.append(worker_factory(**env))}
    finally:
        for each in workers:  # first: a worker would recover the instances killed below, relays and all
            each.stop()
        kill_session_instances()
        for net in (Path(settings.VAR_DIR) / "net").glob("*"):  # every relay this test's instances had
            stop_relays_in(net)


def _spec(tenant: Tenant) -> Any:
    return tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))


def _environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def _net_ns(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _listening_in(pid: int) -> set[int]:
    """The TCP ports listening in the network namespace of ``pid`` (its own /proc/<pid>/net/tcp)."""
    ports = set()
    for name in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


def _machine_ip() -> str:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name == "AF_INET" and not address.address.startswith("127."):
                return str(address.address)
    return ""


def test_an_isolated_instance_boots_reaches_only_its_grants_and_runs_a_task(isolated, live_server) -> None:  # type: ignore[no-untyped-def]
    a = isolated["a"]
    host = live_host_pid(_spec(a))
    assert host is not None
    assert _net_ns(host) != _net_ns("self"), "the host runs in the machine's network namespace"
    env = _environ(host)
    # Rewritten by the driver: the database over the granted unix socket, the internal API at the host's loopback.
    assert f"host={INSIDE_DIR}" in env["AGENT_DATABASE_URL"] or f"host='{INSIDE_DIR}'" in env["AGENT_DATABASE_URL"]
    cp_port = int(live_server.url.rsplit(":", 1)[1])
    assert env["AGENT_CONTROL_PLANE_URL"] == f"http://127.0.0.1:{cp_port}"
    api_port = int((Path(env["AGENT_VOLUME"]) / ".host" / "http-port").read_text())
    # In its namespace only its own API and the loopback end of the internal API's grant listen.
    assert _listening_in(host) == {api_port, cp_port}
    # Outside: one relay per grant, owned by root, its socket the tenant's only.
    sockets = {p.name: p.stat() for p in relay_dir(a.resource_name).iterdir() if p.suffix != ".pid"}
    db_port = int(str(_spec(a).resources["database"].details.get("port", "") or 5432))
    assert set(sockets) == {f".s.PGSQL.{db_port}", "control-plane.sock"}, sockets
    assert all(s.st_mode & 0o777 == 0o600 and s.st_uid == psutil.Process(host).uids().real for s in sockets.values())

    # A task that needs the database and the internal API (its credential is delivered through it) runs to done.
    credential_put(tenant=a, name="openai", value="sk-net-test", actor=SYSTEM)
    instance_submit_task(tenant=a, kind="needs_key", params={}, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=a)["tasks"].get("done") == 1, timeout=90, what="task done")
    instance = AgentInstance.objects.get(tenant=a)
    first = wait_for(lambda: heartbeat_store().get(str(instance.pk)), timeout=30, what="a heartbeat")
    wait_for(lambda: (heartbeat_store().get(str(instance.pk)) or first).seen_at > first.seen_at,  # type: ignore[attr-defined]
             timeout=30, what="heartbeats keep arriving")
    # The control plane reaches the instance's API in its namespace (signed call through the instance client).
    from instances.client import InstanceClient

    status, answer = InstanceClient(a).request_json("GET", "/v1/tasks")
    assert status == 200 and "tasks" in answer, answer


def test_from_inside_nothing_on_the_machine_answers(isolated) -> None:  # type: ignore[no-untyped-def]
    a, b = isolated["a"], isolated["b"]
    ports = listening_loopback_ports()
    b_volume = Path(_spec(b).resources["volume"].details["path"])
    b_port = int((b_volume / ".host" / "http-port").read_text())
    # The machine's PostgreSQL and Redis, and B's instance API (its port, whatever namespace it is in).
    assert 5432 in ports and 6379 in ports
    targets = sorted({*ports, 5432, 6379, b_port})
    argv, env = instance_command(_spec(a), [sys.executable, "-I", "-c", ATTACK, json.dumps(
        {"ports": targets, "machine_ip": _machine_ip(), "inside_dir": str(INSIDE_DIR)})])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["ports"]) == len(targets) > 3
    for kind in ("ports", "ports_v6", "machine_address", "outside"):
        reached = {p: how for p, how in found[kind].items() if how == "connected"}
        assert not reached, (kind, reached)
    assert set(found["ports"].values()) <= {"ECONNREFUSED"}, found["ports"]
    assert set(found["outside"].values()) <= {"ENETUNREACH"}, found["outside"]
    assert found["interfaces"] == ["lo"], found["interfaces"]
    # The granted sockets are reachable by name only (the directory is root's, 0711: nothing to list or add).
    assert found["granted_listing"] == "EACCES", found["granted_listing"]


def test_the_posture_says_isolated_and_the_inside_probe_reaches_nothing(isolated) -> None:  # type: ignore[no-untyped-def]
    from provisioning.fleet.posture import isolation_posture
    from provisioning.fleet.posture_inside import inside_posture_lines, run_inside_probe

    network = next(line for line in isolation_posture() if line.boundary == "network")
    assert network.status == "pass" and network.detail.startswith("isolated"), network
    for spec in (_spec(isolated["a"]), None):  # the tenant's own sandbox, and nobody's (a release check)
        found = run_inside_probe(spec=spec)
        assert found["reachable"] == {} and found["postgres"] == {} and found["redis"] == {}, found
    lines = {line.boundary: line for line in inside_posture_lines(_spec(isolated["a"]))}
    for boundary in ("loopback services (inside)", "database trust (inside)", "redis auth (inside)"):
        assert lines[boundary].status == "pass", lines[boundary]


def _relays(tenant: Tenant) -> list[int]:
    """The live socat relays of the tenant's grants."""
    pids = [int(p.read_text()) for p in relay_dir(tenant.resource_name).glob("*.pid")]
    return sorted(p for p in pids if psutil.pid_exists(p) and psutil.Process(p).name() == "socat")


def _beats_after(tenant: Tenant, since: float, what: str) -> None:
    instance = AgentInstance.objects.get(tenant=tenant)
    wait_for(lambda: (beat := heartbeat_store().get(str(instance.pk))) is not None and beat.seen_at > since,
             timeout=30, what=what)


def test_an_isolated_host_outlives_its_worker_and_is_recovered_from_sigkill(isolated) -> None:  # type: ignore[no-untyped-def]
    a = isolated["a"]
    host = live_host_pid(_spec(a))
    assert host is not None
    relays = _relays(a)
    assert len(relays) == 2
    # The worker that started the host and its relays dies: both keep running, and the host keeps beating.
    isolated["worker"].kill()
    time.sleep(1)
    assert _relays(a) == relays and live_host_pid(_spec(a)) == host
    _beats_after(a, time.time(), "heartbeats after the worker died")

    isolated["start_worker"]()
    psutil.Process(host).kill()
    psutil.Process(host).wait(10) if psutil.pid_exists(host) else None
    # Its parent is gone: the notice comes from the fleet's watcher (``watch_instances``), told here as it tells it.
    assert on_exit(str(a.pk), pid=host, returncode=-9) == "recovery started"
    event = _wait_recovered(a)
    assert event.outcome == "succeeded", event.detail
    again = wait_for(lambda: live_host_pid(_spec(a)), timeout=30, what="a new host")
    assert again != host and _net_ns(again) != _net_ns("self")
    assert len(_relays(a)) == 2  # the recovery's stop ended them, its ensure started them again
    _beats_after(a, time.time(), "heartbeats from the recovered host")


GRANT_PROBE = r'''
import errno, json, socket, sys, os
from agent_runtime.host.netforward import start_forwards
t = json.loads(sys.argv[1])
start_forwards(os.environ["AGENT_NET_FORWARDS"])  # as agent-host does at its start

def ask(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"ping\n")
            return s.recv(100).decode()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc)) if exc.errno else type(exc).__name__

print(json.dumps({"granted": ask(t["granted"]), "other": ask(t["other"])}))
'''


def _answering_peer(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """A TCP peer on 127.0.0.1 (as the demo's are) that answers each connection's first line with ``reply``."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(100)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_a_loopback_grant_reaches_that_one_peer_and_no_other(isolated, settings) -> None:  # type: ignore[no-untyped-def]
    """``LOCAL_INSTANCE_LOOPBACK_GRANTS`` (how ``make demo`` lets isolated instances reach its local peers): the
    granted ip:port answers from inside at the same 127.0.0.1 address, through one more relay; a peer beside it on
    the same loopback, not granted, does not."""
    granted, other = _answering_peer(b"granted\n"), _answering_peer(b"other\n")
    try:
        granted_port, other_port = granted[0].getsockname()[1], other[0].getsockname()[1]
        settings.LOCAL_INSTANCE_LOOPBACK_GRANTS = [f"127.0.0.1:{granted_port}"]
        argv, env = instance_command(_spec(isolated["a"]), [sys.executable, "-c", GRANT_PROBE, json.dumps(
            {"granted": granted_port, "other": other_port})])
        assert f"{granted_port}={INSIDE_DIR}/loopback-{granted_port}.sock" in env["AGENT_NET_FORWARDS"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert found == {"granted": "granted\n", "other": "ECONNREFUSED"}, found
        relay = relay_dir(isolated["a"].resource_name) / f"loopback-{granted_port}.pid"
        assert psutil.Process(int(relay.read_text())).cmdline()[-1] == f"TCP:127.0.0.1:{granted_port}"
    finally:
        granted[0].close()
        other[0].close()


def _tools_without_socat(tmp_path: Path) -> str:
    """A PATH holding the sandbox's tools (links to the real ones) and no socat: a machine that lacks only it."""
    for tool in ("bwrap", "setpriv", "prlimit"):
        found = shutil.which(tool)
        assert found, tool
        (tmp_path / tool).symlink_to(found)
    return str(tmp_path)


def test_auto_is_the_default_isolated_here_and_shared_where_the_machine_cannot(settings, tmp_path,  # type: ignore[no-untyped-def]
                                                                                monkeypatch) -> None:
    """The default isolates wherever the machine can (this one: root, bwrap, socat); where it cannot, it shares and
    the posture's ``network`` line says why. ``shared`` chosen says so too, with the loopback ports counted."""
    from controlplane.config_table import SETTINGS
    from provisioning.drivers.local_network import network_isolated
    from provisioning.drivers.local_support import network_choice
    from provisioning.fleet.posture import isolation_posture

    def network_line() -> Any:
        return next(line for line in isolation_posture() if line.boundary == "network")

    assert SETTINGS["LOCAL_INSTANCE_NETWORK"].default == "auto"
    settings.LOCAL_INSTANCE_NETWORK = "auto"
    assert network_isolated() and network_choice("auto", "auto") == (True, "")
    line = network_line()
    assert line.status == "pass" and line.detail.startswith("isolated"), line
    # Without socat, without root, without the sandbox: shared, saying why.
    without_socat = _tools_without_socat(tmp_path)
    assert network_choice("auto", "auto", path=without_socat) == (
        False, "LOCAL_INSTANCE_NETWORK=auto and socat is missing (Debian: apt-get install socat)")
    assert "does not run as root" in network_choice("auto", "auto", euid=1000)[1]
    assert network_choice("auto", "off") == (False, "LOCAL_INSTANCE_NETWORK=auto and no sandbox: "
                                                    "LOCAL_INSTANCE_ISOLATION=off")
    assert network_choice("isolated", "auto") == (True, "")  # asked for: refused at start without socat, never shared
    # This process on such a machine: its PATH holds the sandbox's tools and not socat.
    monkeypatch.setenv("PATH", without_socat)
    assert not network_isolated()
    line = network_line()
    assert line.status == "degraded" and "socat is missing" in line.detail and "install socat" in line.fix, line
    monkeypatch.undo()

    settings.LOCAL_INSTANCE_NETWORK = "shared"
    line = network_line()
    assert line.status == "degraded" and line.detail.startswith("shared (LOCAL_INSTANCE_NETWORK=shared)"), line
    # The machine's PostgreSQL, Redis... (other sessions open and close ports meanwhile: not an exact count).
    count = int(line.detail.split("; ")[1].split()[0])
    assert count >= 2 and abs(count - len(listening_loopback_ports())) < 10, line.detail


def test_ending_relays_waits_for_their_exit_not_for_their_reaping(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Relays outlive the worker that started them, so their parent is pid 1, which reaps when it does (here about
    2 s later): a stop ends eight of them per instance with the demo's grants, and must not wait for the reaping."""
    target = _answering_peer(b"x\n")[0]
    try:
        port = target.getsockname()[1]
        # Started by a shell that exits at once, as a worker does later: the relays are not this process's children.
        script = "".join(f"socat UNIX-LISTEN:{tmp_path}/r{i}.sock,fork TCP:127.0.0.1:{port} </dev/null >/dev/null "
                          f"2>&1 & echo $! > {tmp_path}/r{i}.pid; " for i in range(8))
        subprocess.run(["setsid", "sh", "-c", script], check=True, timeout=30)
        pids = [int(p.read_text()) for p in sorted(tmp_path.glob("*.pid"))]
        wait_for(lambda: all((tmp_path / f"r{i}.sock").exists() for i in range(8)), timeout=10, what="relays")
        assert len(pids) == 8 and all(psutil.Process(p).ppid() != os.getpid() for p in pids)
        started = time.monotonic()
        stop_relays_in(tmp_path)
        took = time.monotonic() - started
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)
        assert took < 2.0, f"ending 8 relays took {took:.1f} s"
        assert not list(tmp_path.glob("*.pid"))
    finally:
        target.close()
