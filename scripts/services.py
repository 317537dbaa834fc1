"""Start and stop the control plane's processes for the demo: web, Celery worker, Celery beat.

Pid files in var/run, logs in var/log. ``start`` first creates the generated development secrets
(Django's secret key, the vault's key ring) so the processes it starts all read the same files
instead of racing to create them. ``stop`` also stops the tenants' local instances (agent-host
processes) so nothing is left running, and the embedded PgBouncer after them (``EMBEDDED_PGBOUNCER``: on by
default here where Debian's pgbouncer is installed; the next process to start brings it back). The embedded
PostgreSQL is left up: it is shared, cheap, and the next run reuses it.
"""

from __future__ import annotations

import json
import os
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

from controlplane.pgbouncer import (  # noqa: E402
    embedded_pgbouncer_port,
    embedded_pgbouncer_stop,
    pgbouncer_installed,
)
from controlplane.secretfiles import DEV_KEYRING_FILE, DEV_SECRET_KEY_FILE, dev_secrets_ensure  # noqa: E402

VAR = Path(os.environ.get("CONTROLPLANE_VAR_DIR", ROOT / "var"))
RUN, LOG = VAR / "run", VAR / "log"
PORT_FILE = RUN / "web-port"  # the port the running stack serves on (make run, then make demo, reuse it)
PEER_OFFSETS = (25, 26, 27)  # the SMTP sink, the payment provider and the chat model sit beside the web port


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


def _running_port() -> int | None:
    """The port of a web server this tool started and that still runs (its pid file and port file agree)."""
    try:
        pid = int((RUN / "web.pid").read_text())
        port = int(PORT_FILE.read_text())
        return port if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, psutil.Error):
        return None


PORT = choose_port(os.environ.get("DEMO_PORT"), running_on=_running_port())
BASE_URL = f"http://127.0.0.1:{PORT}"
SMTP_PORT = int(os.environ.get("DEMO_SMTP_PORT", str(PORT + 25)))
PAYMENTS_PORT = int(os.environ.get("DEMO_PAYMENTS_PORT", str(PORT + 26)))
CHAT_PORT = int(os.environ.get("DEMO_CHAT_PORT", str(PORT + 27)))
# The local peers the demo agent's irreversible effects go to (an SMTP sink, a payment provider stub), and the
# OpenAI-compatible chat model the support agent answers customers with.
SINK_ENV = {"AGENT_SMTP_SINK_PORT": str(SMTP_PORT), "AGENT_SMTP_SINK_LOG": str(VAR / "log" / "smtp-sink.jsonl"),
            "AGENT_PAYMENTS_PORT": str(PAYMENTS_PORT), "AGENT_CHAT_PORT": str(CHAT_PORT)}
CHAT_API_KEY = "sk-local"  # the local chat model's key; each demo tenant stores it as its "openai" credential
INSTANCE_EXTRA_ENV = json.dumps({
    "AGENT_SMTP_URL": f"smtp://127.0.0.1:{SMTP_PORT}", "AGENT_PAYMENTS_URL": f"http://127.0.0.1:{PAYMENTS_PORT}",
    # The demo's payment peer indexes a charge for search the moment it is made (no lag): "absent" is true at once.
    "AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S": "0",
    "AGENT_CONFIG": json.dumps({"llm_url": f"http://127.0.0.1:{CHAT_PORT}/v1", "llm_model": "local-support",
                                "orders": {"1042": {"status": "shipped", "carrier": "DHL", "eta": "Thursday"}}}),
})

PEERS = ("smtp", "payments", "chat-model")
COMMANDS: dict[str, list[str]] = {
    "smtp": [sys.executable, "-m", "agent_examples.peers.smtp"],
    "payments": [sys.executable, "-m", "agent_examples.peers.payments"],
    "chat-model": [sys.executable, "-m", "agent_examples.peers.chat_model"],
    "web": [sys.executable, "manage.py", "runserver", f"127.0.0.1:{PORT}", "--noreload", "--insecure"],
    "worker": [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--concurrency=2",
               "--loglevel=INFO", "-Q", os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "controlplane")],
    "beat": [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO",
             "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler", "--pidfile="],
}


def _alive(name: str) -> int | None:
    try:
        pid = int((RUN / f"{name}.pid").read_text())
        proc = psutil.Process(pid)
        return pid if proc.status() != psutil.STATUS_ZOMBIE else None
    except (FileNotFoundError, ValueError, psutil.Error):
        return None


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


def start() -> None:
    secrets_ensure()
    RUN.mkdir(parents=True, exist_ok=True)
    # The control plane's logs are its own: private to its user (the isolation posture checks it).
    LOG.mkdir(mode=0o700, parents=True, exist_ok=True)
    LOG.chmod(0o700)
    for existing in LOG.iterdir():
        existing.chmod(0o600)
    env = service_env()
    for name, cmd in COMMANDS.items():
        if _alive(name):
            print(f"  {name:<8} already running (pid {_alive(name)})")
            continue
        with open(os.open(LOG / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            # The local peers write their own logs under var/log (the SMTP sink's messages): private to this user.
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    umask=0o077 if name in PEERS else -1)
        (RUN / f"{name}.pid").write_text(str(proc.pid))
        if name == "web":
            PORT_FILE.write_text(str(PORT))
        print(f"  {name:<8} started (pid {proc.pid}, log {LOG / (name + '.log')})")
    if PORT != 8000 and not os.environ.get("DEMO_PORT"):
        print(f"  port 8000 is taken: serving on {BASE_URL} (set DEMO_PORT to choose)")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        web = _alive("web")
        if web is None:
            raise SystemExit(f"the web server exited at start (see {LOG / 'web.log'})")
        try:
            with urllib.request.urlopen(f"{BASE_URL}/healthz", timeout=2) as resp:  # noqa: S310
                # Only our own server counts: another program answering on the port is not the control plane.
                listening = {c.laddr.port for c in psutil.Process(web).net_connections(kind="tcp")
                             if c.status == psutil.CONN_LISTEN}
                if resp.status == 200 and PORT in listening:
                    _manage("local_instances", "start")  # the ones `make stop` stopped on purpose
                    return
        except (OSError, psutil.Error):
            pass
        time.sleep(0.3)
    raise SystemExit(f"the web server did not answer on {BASE_URL} (see {LOG / 'web.log'})")


def _terminate(pid: int, label: str) -> None:
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.Error:
        return
    print(f"  {label} stopped (pid {pid})")


def service_env() -> dict[str, str]:
    """The environment of every process started here: the web, worker and beat, and the management commands
    that start instances (which must get the same INSTANCE_EXTRA_ENV: the peers' addresses, and the same
    EMBEDDED_PGBOUNCER: on by default where PgBouncer is installed, so the demo's instances are pooled)."""
    return {**os.environ, **SINK_ENV, "INSTANCE_EXTRA_ENV": INSTANCE_EXTRA_ENV,
            "HEARTBEAT_TIMEOUT_S": os.environ.get("HEARTBEAT_TIMEOUT_S", "6"),
            "EMBEDDED_PGBOUNCER": os.environ.get("EMBEDDED_PGBOUNCER", "true" if pgbouncer_installed() else "false"),
            "CONTROL_PLANE_INTERNAL_URL": os.environ.get("CONTROL_PLANE_INTERNAL_URL", BASE_URL)}


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


def stop() -> None:
    # Instances first, as a planned stop (marked stopped, heartbeat forgotten): the recovery sweep must not
    # count them as dead when the stack comes back.
    if _alive("web") or _alive("worker"):
        _manage("local_instances", "stop")
    for name in COMMANDS:
        pid = _alive(name)
        if pid:
            _terminate(pid, name)
        (RUN / f"{name}.pid").unlink(missing_ok=True)
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
        _terminate(pid, f"instance {pidfile.parent.parent.name}")
    # After the instances (they were its clients); the next start of any process brings it back.
    stopped = embedded_pgbouncer_stop(VAR / "pgbouncer")
    if stopped:
        print(f"  pgbouncer stopped (pid {stopped})")


if __name__ == "__main__":
    action = sys.argv[1] if len(sys.argv) > 1 else "start"
    {"start": start, "stop": stop}[action]()
