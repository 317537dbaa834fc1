"""Start, supervise and stop the control plane's processes on one machine (``make run``, ``make demo``, ``make stop``).

usage: python scripts/services.py start | stop [--keep-db] | status | clean

``start`` runs web, the Celery worker, beat, the instance exit watcher (``manage.py watch_instances``), whenever
instances are isolated (``LOCAL_INSTANCE_NETWORK=auto``, the default, on a machine that sandboxes and has ``socat``;
or ``isolated``) the machine's egress proxy (``manage.py egress_proxy`` on ``EGRESS_PROXY_ADDRESS``, default
``127.0.0.1:<web port + 30>``: every isolated instance's way to the internet, one process for all of them) and the
demo's local peers (SMTP sink, payment provider, chat model, OAuth server, the example CRM's MCP server) under
**supervisord** (the ``supervisor`` package): a daemon of its own (pid in var/run/supervisord.pid, control socket
var/run/supervisor.sock, 0700) that restarts a process which exits, at once the first time and with a growing
backoff (1 s, 2 s, 3 s, ...) while it keeps failing within 5 s of its start, giving up after 20 such tries. Its
event listener (``manage.py supervisor_events``) marks a crashed worker or beat down at once (``/readyz``, the
staff dashboard), writes a line to var/log/restarts.log, and an audit row ``service.restart`` once the process
runs again. supervisord fits as it is (autorestart, backoff, process groups, an event protocol), so no loop of our
own is needed; honcho, the other candidate, stops everything when one process exits. Logs: var/log/<name>.log.

Before its first process, ``start`` creates the generated development secrets (Django's secret key, the
vault's key ring) so the processes all read the same files instead of racing to create them. The processes
inherit supervisord's environment (``service_env``: nothing secret is written into its config file).

``stop`` stops everything the demo started and says what: the tenants' local instances first (a planned stop,
never counted as a recovery), then supervisord with every process it runs, then the embedded PgBouncer, the
embedded Redis and the embedded PostgreSQL (``--keep-db``, ``make stop KEEP_DB=1``, leaves PostgreSQL up).
``clean`` stops, removes the per-instance system users (``agt-*``) of this var/ directory's tenants, then var/.
``CONTROLPLANE_VAR_DIR`` chooses the var/ directory (default: var/ in the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # controlplane.secretfiles (a plain module: no Django set-up)

from controlplane.embedded_pg import embedded_server_running, embedded_server_stop  # noqa: E402
from controlplane.embedded_redis import embedded_redis_running, embedded_redis_stop  # noqa: E402
from controlplane.pgbouncer import (  # noqa: E402
    embedded_pgbouncer_port,
    embedded_pgbouncer_running,
    embedded_pgbouncer_stop,
    pgbouncer_installed,
)
from controlplane.secretfiles import (  # noqa: E402
    DEV_KEYRING_FILE,
    DEV_SECRET_KEY_FILE,
    dev_secrets_ensure,
    read_or_create_secret,
)
from provisioning.drivers.local_support import network_choice  # noqa: E402

VAR = Path(os.environ.get("CONTROLPLANE_VAR_DIR", ROOT / "var")).resolve()
RUN, LOG = VAR / "run", VAR / "log"
PORT_FILE = RUN / "web-port"  # the port the running stack serves on (make run, then make demo, reuse it)
# The SMTP sink, the payment provider, the chat model, the example OAuth server and the example CRM's MCP server
# sit beside the web port.
# With isolated instances the egress proxy listens at the web port + 30 too. The driver's own rule
# (provisioning/drivers/local_support.py: no Django), read here from the same environment the worker gets.
ISOLATED, SHARED_BECAUSE = network_choice(os.environ.get("LOCAL_INSTANCE_NETWORK") or "auto",
                                          os.environ.get("LOCAL_INSTANCE_ISOLATION") or "auto")
PEER_OFFSETS = (25, 26, 27, 28, 29, *((30,) if ISOLATED and not os.environ.get("EGRESS_PROXY_ADDRESS") else ()))


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As a server binds: a connection of a server that just stopped (TIME_WAIT) does not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(requested: str | None, *, running_on: int | None = None, first: int = 8000, tries: int = 100) -> int:
    """The web port: the running stack's, else ``DEMO_PORT`` if it and its peers' ports are free (one clear
    sentence if not), else the first free one from 8000 on. Never "whatever answers on 8000"."""
    if running_on:
        return running_on
    if requested:
        port = int(requested)
        busy = [p for p in (port, *(port + o for o in PEER_OFFSETS)) if not _port_free(p)]
        if busy:
            raise SystemExit(f"port {busy[0]} is taken by another program (DEMO_PORT={port} uses {port} and "
                             f"{port + PEER_OFFSETS[0]}-{port + PEER_OFFSETS[-1]}): stop that program or choose "
                             "another DEMO_PORT")
        return port
    for port in range(first, first + tries):
        if all(_port_free(p) for p in (port, *(port + o for o in PEER_OFFSETS))):
            return port
    raise SystemExit(f"no free port between {first} and {first + tries}: set DEMO_PORT to a free one")


SUPERVISORD_CONF, SUPERVISORD_PID = RUN / "supervisord.conf", RUN / "supervisord.pid"
SUPERVISOR_SOCK = RUN / "supervisor.sock"


def _supervisord_pid() -> int | None:
    """The pid of this var/ directory's supervisord when it runs."""
    try:
        pid = int(SUPERVISORD_PID.read_text())
        proc = psutil.Process(pid)
        return pid if proc.status() != psutil.STATUS_ZOMBIE and "supervisord" in " ".join(proc.cmdline()) else None
    except (OSError, ValueError, psutil.Error):
        return None


def _running_port() -> int | None:
    """The port of the stack this tool started when its supervisor still runs (make run, then make demo)."""
    try:
        return int(PORT_FILE.read_text()) if _supervisord_pid() is not None else None
    except (OSError, ValueError):
        return None


# `stop`, `status`, `clean` and `--help` never choose a port: a taken DEMO_PORT must not stop a stop.
_ACTION = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else "start"
PORT = (choose_port(os.environ.get("DEMO_PORT"), running_on=_running_port()) if _ACTION == "start"
        else _running_port() or int(os.environ.get("DEMO_PORT") or 8000))
BASE_URL = f"http://127.0.0.1:{PORT}"
SMTP_PORT = int(os.environ.get("DEMO_SMTP_PORT", str(PORT + 25)))
PAYMENTS_PORT = int(os.environ.get("DEMO_PAYMENTS_PORT", str(PORT + 26)))
CHAT_PORT = int(os.environ.get("DEMO_CHAT_PORT", str(PORT + 27)))
OAUTH_PORT = int(os.environ.get("DEMO_OAUTH_PORT", str(PORT + 28)))
CRM_PORT = int(os.environ.get("DEMO_CRM_PORT", str(PORT + 29)))
# The machine's egress proxy, run only for isolated instances (shared ones keep the machine's network).
EGRESS_PROXY_ADDRESS = os.environ.get("EGRESS_PROXY_ADDRESS") or (f"127.0.0.1:{PORT + 30}" if ISOLATED else "")
# The demo's peers listen on loopback, which the egress proxy refuses (as it must for the internet's hosts): an
# isolated instance is granted exactly these five ip:ports instead, each a relay like its database's
# (LOCAL_INSTANCE_LOOPBACK_GRANTS, development only: production refuses it). Nothing else on loopback.
LOOPBACK_GRANTS = ",".join(f"127.0.0.1:{p}" for p in (SMTP_PORT, PAYMENTS_PORT, CHAT_PORT, OAUTH_PORT, CRM_PORT))
CRM_URL = f"http://127.0.0.1:{CRM_PORT}/mcp"  # the support agent's MCP server (agent_examples.peers.crm)
OAUTH_CLIENT_ID = "demo-control-plane"  # the demo operator's client at the example OAuth server
# The local peers the demo agent's irreversible effects go to (an SMTP sink, a payment provider stub), and the
# OpenAI-compatible chat model the support agent answers customers with; the example CRM's MCP server it calls
# (its bearer token in a file, as the OAuth client secret: never in an environment; its calls logged under var/log).
SINK_ENV = {"AGENT_SMTP_SINK_PORT": str(SMTP_PORT), "AGENT_SMTP_SINK_LOG": str(VAR / "log" / "smtp-sink.jsonl"),
            "AGENT_PAYMENTS_PORT": str(PAYMENTS_PORT), "AGENT_CHAT_PORT": str(CHAT_PORT),
            "AGENT_OAUTH_PORT": str(OAUTH_PORT), "AGENT_OAUTH_CLIENT_ID": OAUTH_CLIENT_ID,
            "AGENT_OAUTH_CLIENT_SECRET_FILE": str(VAR / "secrets" / "demo-oauth-client-secret"),
            "MCP_PEER_PORT": str(CRM_PORT), "MCP_PEER_CALL_LOG": str(VAR / "log" / "crm-calls.jsonl"),
            "MCP_PEER_TOKEN_FILE": str(VAR / "secrets" / "demo-crm-token")}
CHAT_API_KEY = "sk-local"  # the local chat model's key; each demo tenant stores it as its "openai" credential
INSTANCE_EXTRA_ENV = json.dumps({
    "AGENT_SMTP_URL": f"smtp://127.0.0.1:{SMTP_PORT}", "AGENT_PAYMENTS_URL": f"http://127.0.0.1:{PAYMENTS_PORT}",
    # The demo's payment peer indexes a charge for search the moment it is made (no lag): "absent" is true at once.
    "AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S": "0",
    "AGENT_CONFIG": json.dumps({"llm_url": f"http://127.0.0.1:{CHAT_PORT}/v1", "llm_model": "local-support",
                                "orders": {"1042": {"status": "shipped", "carrier": "DHL", "eta": "Thursday"}},
                                # The calendar agent's provider API (agent_examples.connected).
                                "calendar_url": f"http://127.0.0.1:{OAUTH_PORT}/resource"}),
})


PEERS = ("smtp", "payments", "chat-model", "oauth", "crm")
# In start order (supervisord's priority); stopped in the reverse order.
COMMANDS: dict[str, list[str]] = {
    "smtp": [sys.executable, "-m", "agent_examples.peers.smtp"],
    "payments": [sys.executable, "-m", "agent_examples.peers.payments"],
    "chat-model": [sys.executable, "-m", "agent_examples.peers.chat_model"],
    "oauth": [sys.executable, "-m", "agent_examples.peers.oauth"],
    "crm": [sys.executable, "-m", "agent_examples.peers.crm"],
    "web": [sys.executable, "manage.py", "runserver", f"127.0.0.1:{PORT}", "--noreload", "--insecure"],
    "worker": [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--concurrency=2",
               "--loglevel=INFO", "-Q", os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "controlplane")],
    "beat": [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO",
             "--scheduler", "controlplane.leases.beat:LeaderScheduler", "--pidfile="],
    # Notices an instance's exit in about a second, whoever started it (provisioning/recovery/local_exit_watch.py).
    "watcher": [sys.executable, "manage.py", "watch_instances"],
    # Every isolated instance's way out (tenant by proxy credential; docs/security.md#egress).
    **({"egress": [sys.executable, "manage.py", "egress_proxy", "--listen", EGRESS_PROXY_ADDRESS]}
       if EGRESS_PROXY_ADDRESS else {}),
}
# supervisord's event listener: records each crash and restart (audit row, var/log/restarts.log, liveness).
LISTENER = [sys.executable, "manage.py", "supervisor_events"]
START_SECS = 5  # a process that exits sooner counts as failing to start: retried with a growing backoff
START_RETRIES = 20
STOP_WAIT_S = 20  # SIGTERM, then SIGKILL to the process group after this long (the worker finishes its task)


def secrets_ensure() -> None:
    """Create the development secrets the environment does not provide, before any process starts.

    Each is created at most once (atomically); a process started later, or one racing this
    function, reads the same file. Secrets given in the environment are left to the environment.
    """
    names = []
    if not os.environ.get("SECRET_KEY"):
        names.append(DEV_SECRET_KEY_FILE)
    if not os.environ.get("VAULT_KEK_KEYRING") and os.environ.get("VAULT_KEK_PROVIDER", "local") == "local":
        names.append(DEV_KEYRING_FILE)
    for name, outcome in dev_secrets_ensure(VAR, tuple(names)).items():
        if outcome == "created":
            print(f"  secrets  created {VAR / 'secrets' / name}")
    # The demo operator's client secret at the example OAuth server: the server and the demo read this file.
    read_or_create_secret(SINK_ENV["AGENT_OAUTH_CLIENT_SECRET_FILE"], lambda: secrets.token_urlsafe(32))
    # The bearer token the CRM's MCP server asks for: the demo stores it as the customer's "crm-token" credential.
    read_or_create_secret(SINK_ENV["MCP_PEER_TOKEN_FILE"], lambda: secrets.token_urlsafe(32))




def supervisor_config() -> str:
    """supervisord's configuration: no secret in it (the programs inherit supervisord's environment)."""
    def section(title: str, **options: object) -> list[str]:
        return [f"[{title}]", *(f"{k}={v}" for k, v in options.items()), ""]

    lines = ["; Written by scripts/services.py at each start; edit that, not this.", ""]
    lines += section("unix_http_server", file=SUPERVISOR_SOCK, chmod="0700")
    # umask 077: supervisord's own files (the logs under var/log) are private to this user.
    lines += section("supervisord", logfile=LOG / "supervisord.log", logfile_maxbytes="5MB", logfile_backups=2,
                     pidfile=SUPERVISORD_PID, childlogdir=LOG, directory=ROOT, umask="077", nodaemon="false",
                     identifier="controlplane")
    lines += section("rpcinterface:supervisor",
                     **{"supervisor.rpcinterface_factory": "supervisor.rpcinterface:make_main_rpcinterface"})
    lines += section("supervisorctl", serverurl=f"unix://{SUPERVISOR_SOCK}")
    lines += section("eventlistener:events", command=shlex.join(LISTENER), directory=ROOT, priority=1,
                     events="PROCESS_STATE_EXITED,PROCESS_STATE_BACKOFF,PROCESS_STATE_STARTING,PROCESS_STATE_RUNNING,"
                            "PROCESS_STATE_FATAL",
                     autorestart="true", stdout_logfile="NONE", stderr_logfile=LOG / "supervisor-events.log",
                     buffer_size=100)
    for priority, (name, cmd) in enumerate(COMMANDS.items(), start=10):
        # The peers write their own files under var/log (the SMTP sink's messages): private to this user. The
        # others keep the usual 022: the worker installs releases that the instances' own users must read.
        lines += section(f"program:{name}", command=shlex.join(cmd), directory=ROOT, priority=priority,
                         umask="077" if name in PEERS else "022", autostart="true", autorestart="true",
                         startsecs=START_SECS, startretries=START_RETRIES, stopsignal="TERM",
                         stopwaitsecs=STOP_WAIT_S, stopasgroup="true", killasgroup="true", redirect_stderr="true",
                         stdout_logfile=LOG / f"{name}.log", stdout_logfile_maxbytes="20MB", stdout_logfile_backups=2)
    return "\n".join(lines)


def _rpc():  # type: ignore[no-untyped-def]
    """supervisord's XML-RPC interface over its unix socket."""
    import xmlrpc.client

    from supervisor.xmlrpc import SupervisorTransport

    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=SupervisorTransport(
        None, None, serverurl=f"unix://{SUPERVISOR_SOCK}"))


def processes() -> dict[str, dict]:
    """supervisord's view of each program (state, pid, ...), by name; empty when it does not run."""
    if _supervisord_pid() is None:
        return {}
    try:
        return {info["name"]: info for info in _rpc().supervisor.getAllProcessInfo()}
    except OSError:
        return {}


def program_pid(name: str) -> int | None:
    info = processes().get(name)
    return int(info["pid"]) if info and info["pid"] and info["statename"] in ("RUNNING", "STARTING") else None


def _stop_unsupervised() -> None:
    """A stack started before supervision (pid files var/run/<name>.pid): stopped so the supervisor's takes over."""
    for name in COMMANDS:
        pidfile = RUN / f"{name}.pid"
        try:
            pid = int(pidfile.read_text())
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                _terminate(pid, f"{name} (unsupervised)")
        except (OSError, ValueError, psutil.Error):
            pass
        pidfile.unlink(missing_ok=True)


def start() -> None:
    secrets_ensure()
    RUN.mkdir(parents=True, exist_ok=True)
    # The control plane's logs are its own: private to its user (the isolation posture checks it).
    LOG.mkdir(mode=0o700, parents=True, exist_ok=True)
    LOG.chmod(0o700)
    for existing in LOG.iterdir():
        existing.chmod(0o600)
    _stop_unsupervised()
    if _supervisord_pid() is None:
        SUPERVISORD_CONF.write_text(supervisor_config())
        SUPERVISORD_CONF.chmod(0o600)
        PORT_FILE.write_text(str(PORT))
        # supervisord daemonizes: this returns once it has forked; its programs inherit this environment.
        done = subprocess.run([sys.executable, "-m", "supervisor.supervisord", "-c", str(SUPERVISORD_CONF)],
                              cwd=ROOT, env=service_env(), capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SystemExit(f"supervisord did not start: {(done.stderr or done.stdout).strip()[-500:]}")
        _wait(lambda: processes(), 30, "supervisord did not answer on its socket (see var/log/supervisord.log)")
        print(f"  supervisor started (pid {_supervisord_pid()}, log {LOG / 'supervisord.log'})")
    else:
        for name, info in processes().items():  # stopped by hand, or given up on: started again
            if info["statename"] not in ("RUNNING", "STARTING", "BACKOFF"):
                _rpc().supervisor.startProcess(name, False)
        print(f"  supervisor already running (pid {_supervisord_pid()})")
    for name in COMMANDS:
        info = processes().get(name, {})
        print(f"  {name:<10} {info.get('statename', '?').lower()} (pid {info.get('pid') or '-'}, "
              f"log {LOG / (name + '.log')})")
    print("  network    " + (f"isolated: each instance in a namespace of its own (egress proxy {EGRESS_PROXY_ADDRESS}, "
                              f"loopback peers granted: {service_env()['LOCAL_INSTANCE_LOOPBACK_GRANTS']})"
                              if ISOLATED else f"shared ({SHARED_BECAUSE})"))
    if PORT != 8000 and not os.environ.get("DEMO_PORT"):
        print(f"  port 8000 is taken: serving on {BASE_URL} (set DEMO_PORT to choose)")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        web = program_pid("web")
        if web is None and processes().get("web", {}).get("statename") in ("FATAL", "EXITED", "STOPPED"):
            raise SystemExit(f"the web server exited at start (see {LOG / 'web.log'})")
        try:
            with urllib.request.urlopen(f"{BASE_URL}/healthz", timeout=2) as resp:  # noqa: S310
                # Only our own server counts: another program answering on the port is not the control plane.
                listening = {c.laddr.port for c in psutil.Process(web).net_connections(kind="tcp")
                             if c.status == psutil.CONN_LISTEN} if web else set()
                if resp.status == 200 and PORT in listening:
                    _manage("local_instances", "start")  # the ones `make stop` stopped on purpose
                    return
        except (OSError, psutil.Error):
            pass
        time.sleep(0.3)
    raise SystemExit(f"the web server did not answer on {BASE_URL} (see {LOG / 'web.log'})")


def _wait(predicate, timeout_s: float, message: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(message)
        time.sleep(0.1)


def _terminate(pid: int, label: str) -> bool:
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.Error:
        return False
    print(f"  {label} stopped (pid {pid})")
    return True


def service_env() -> dict[str, str]:
    """The environment of every process started here: the web, worker and beat, and the management commands
    that start instances (which must get the same INSTANCE_EXTRA_ENV: the peers' addresses, and the same
    EMBEDDED_PGBOUNCER: on by default where PgBouncer is installed, so the demo's instances are pooled)."""
    return {**os.environ, **SINK_ENV, "INSTANCE_EXTRA_ENV": INSTANCE_EXTRA_ENV, "CONTROLPLANE_VAR_DIR": str(VAR),
            "HEARTBEAT_TIMEOUT_S": os.environ.get("HEARTBEAT_TIMEOUT_S", "6"),
            # The example OAuth server is plain http on 127.0.0.1: a real provider's endpoints must be https and
            # resolve to public addresses (docs/connections.md), neither of which a local demo peer can be.
            "OAUTH_ALLOW_HTTP_LOOPBACK": os.environ.get("OAUTH_ALLOW_HTTP_LOOPBACK", "true"),
            "OAUTH_ALLOW_PRIVATE_ADDRESSES": os.environ.get("OAUTH_ALLOW_PRIVATE_ADDRESSES", "true"),
            # Likewise the example CRM's MCP server (http://127.0.0.1): the registry takes https URLs only unless
            # this is set (its default is DEBUG, off in production).
            "MCP_SERVERS_ALLOW_HTTP": os.environ.get("MCP_SERVERS_ALLOW_HTTP", "true"),
            "EMBEDDED_PGBOUNCER": os.environ.get("EMBEDDED_PGBOUNCER", "true" if pgbouncer_installed() else "false"),
            "CONTROL_PLANE_INTERNAL_URL": os.environ.get("CONTROL_PLANE_INTERNAL_URL", BASE_URL),
            "EGRESS_PROXY_ADDRESS": EGRESS_PROXY_ADDRESS,
            "LOCAL_INSTANCE_LOOPBACK_GRANTS": os.environ.get("LOCAL_INSTANCE_LOOPBACK_GRANTS", LOOPBACK_GRANTS)}


def pgbouncer_port() -> int | None:
    """The port of the embedded PgBouncer when it runs (controlplane/pgbouncer.py keeps it in var/pgbouncer)."""
    return embedded_pgbouncer_port(VAR / "pgbouncer")


def _manage(*args: str, timeout: float = 120) -> None:
    """A management command with the services' environment; its failure is reported, never fatal here."""
    try:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=service_env(),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"  manage.py {' '.join(args)} timed out")
        return
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        print(f"  manage.py {' '.join(args)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def stop(*, keep_db: bool = False) -> None:
    """Stop everything started for this var/ directory, saying what; PostgreSQL stays up with ``keep_db``."""
    stopped = 0
    running = processes()
    # Instances first, as a planned stop (marked stopped, heartbeat forgotten): the recovery sweep must not
    # count them as dead when the stack comes back. The command needs the database and the broker: still up.
    if any(info["statename"] == "RUNNING" for info in running.values()):
        _manage("local_instances", "stop")
    supervisord = _supervisord_pid()
    if supervisord is not None:
        try:
            _rpc().supervisor.shutdown()  # stops every program (SIGTERM to its group, SIGKILL after the wait)
        except OSError:
            os.kill(supervisord, signal.SIGTERM)
        try:
            psutil.Process(supervisord).wait(timeout=STOP_WAIT_S + 30)
        except psutil.TimeoutExpired:
            _terminate(supervisord, "supervisor (did not stop in time)")
        except psutil.Error:
            pass
        for name, info in running.items():
            if info["pid"]:
                print(f"  {name:<10} stopped (pid {info['pid']})")
                stopped += 1
        print(f"  supervisor stopped (pid {supervisord})")
        stopped += 1
    _stop_unsupervised()
    PORT_FILE.unlink(missing_ok=True)
    # instance.pid: the host's pid as this machine sees it (the driver's record); pid: what an instance started
    # before sandboxing wrote itself. Only a live agent-host is signalled (a pid may have been reused).
    for pidfile in [*(VAR / "volumes").glob("*/.host/instance.pid"), *(VAR / "volumes").glob("*/.host/pid")]:
        try:
            pid = int(pidfile.read_text())
            if psutil.Process(pid).cmdline()[1:3] != ["-m", "agent_runtime.host"]:
                continue
        except (ValueError, OSError, psutil.Error):
            continue
        stopped += _terminate(pid, f"instance {pidfile.parent.parent.name}")
    # After the instances (they were its clients).
    for label, stop_one in (("pgbouncer", lambda: embedded_pgbouncer_stop(VAR / "pgbouncer")),
                            ("redis", lambda: embedded_redis_stop(VAR / "redis")),
                            ("postgresql", None if keep_db else lambda: embedded_server_stop(VAR / "pgdata"))):
        if stop_one is None:
            pid = embedded_server_running(VAR / "pgdata")
            if pid:
                print(f"  {label:<10} kept running (pid {pid}, KEEP_DB)")
            continue
        pid = stop_one()
        if pid:
            print(f"  {label:<10} stopped (pid {pid})")
            stopped += 1
    if not stopped:
        print(f"  nothing was running for {VAR}")


def instance_users() -> set[str]:
    """The per-instance system users (agt-*) of this var/ directory's tenants: the owners of its volumes and
    object-store prefixes, and the names derived from the tenant ids those are named after (the driver's rule:
    provisioning.drivers.local_sandbox.instance_user_name)."""
    import hashlib
    import pwd
    import re
    import uuid

    names: set[str] = set()
    for folder in [*(VAR / "volumes").glob("*"), *(VAR / "objectstore").glob("*"), *(VAR / "objectstore").glob("*/*")]:
        found = re.search(r"([0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12})$", folder.name)
        if found:
            tenant_id = str(uuid.UUID(found.group(1)))
            names.add("agt-" + hashlib.sha256(tenant_id.encode()).hexdigest()[:12])
        try:
            names.add(pwd.getpwuid(folder.stat().st_uid).pw_name)
        except (KeyError, OSError):
            pass
    existing = {entry.pw_name for entry in pwd.getpwall()}
    return {n for n in names if n.startswith("agt-") and n in existing}


def mounts_under(root: Path) -> list[str]:
    """Mount points below ``root`` (the tenants' loop-mounted volume images, ``LOCAL_VOLUME_QUOTA=auto``), deepest
    first, as the kernel lists them (``/proc/self/mounts`` escapes a space as ``\\040``)."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1].encode().decode("unicode_escape") for line in lines if len(line.split()) > 1]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def clean() -> None:
    """Stop everything, unmount this var/ directory's volume images, remove its instance users, then the directory
    itself (a mounted image would otherwise keep its loop device and its mount point after the directory is gone)."""
    stop()
    for point in mounts_under(VAR):
        done = subprocess.run(["umount", point], capture_output=True, text=True, check=False)
        if done.returncode != 0:  # still busy a moment after its instance stopped: detach it, the kernel frees it
            done = subprocess.run(["umount", "--lazy", point], capture_output=True, text=True, check=False)
        print(f"  volume image {Path(point).name} " + ("unmounted" if done.returncode == 0
                                                        else f"not unmounted: {done.stderr.strip()}"))
    for name in sorted(instance_users()):
        done = subprocess.run(["userdel", name], capture_output=True, text=True, check=False)
        subprocess.run(["groupdel", name], capture_output=True, check=False)  # --user-group: gone with it, mostly
        print(f"  user {name} " + ("removed" if done.returncode == 0 else f"not removed: {done.stderr.strip()}"))
    shutil.rmtree(VAR, ignore_errors=True)
    print(f"  removed {VAR}")


def status() -> None:
    running = processes()
    if not running:
        print(f"  supervisor not running for {VAR}")
    for name, info in running.items():
        print(f"  {name:<10} {info['statename'].lower():<9} {info['description']}")
    for label, pid in (("pgbouncer", embedded_pgbouncer_running(VAR / "pgbouncer")),
                       ("redis", embedded_redis_running(VAR / "redis")),
                       ("postgresql", embedded_server_running(VAR / "pgdata"))):
        print(f"  {label:<10} {'running' if pid else 'stopped':<9} {f'pid {pid}' if pid else ''}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/services.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    actions = parser.add_subparsers(dest="action", metavar="{start,stop,status,clean}")
    actions.add_parser("start", help="start (or reuse) the supervised stack; prints each process and its log")
    stop_parser = actions.add_parser("stop", help="stop everything started for this var/ directory")
    stop_parser.add_argument("--keep-db", action="store_true", help="leave the embedded PostgreSQL running")
    actions.add_parser("status", help="what runs, as the supervisor sees it")
    actions.add_parser("clean", help="stop, remove this var/ directory's agt-* users, then delete the directory")
    args = parser.parse_args(argv)
    if args.action in (None, "start"):
        start()
    elif args.action == "stop":
        stop(keep_db=args.keep_db or os.environ.get("KEEP_DB", "") not in ("", "0"))
    elif args.action == "status":
        status()
    else:
        clean()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
