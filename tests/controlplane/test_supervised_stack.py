"""Issue 31 (the first run never fails): the local stack as ``make run`` / ``make demo`` start it, for real.

One throw-away var/ directory (never the developer's) holds a whole embedded default: its own PostgreSQL, Redis
(the broker) and PgBouncer, and supervisord running web, worker, beat, the exit watcher and the peers
(``scripts/services.py``). The test session's own ``DATABASE_URL`` and ``CELERY_BROKER_URL`` (the CI machine's
services) are taken out of the stack's environment, so it runs on its embedded services as a new user's would.

- a worker SIGKILLed during onboarding is restarted by the supervisor, ``/readyz`` is 503 naming it while it is
  down, the staff overview is red with the reason, the restart is an audit row and a line in var/log, and the
  onboarding completes;
- ``make stop`` leaves no process of the stack and no port held (``KEEP_DB=1`` first: only PostgreSQL stays);
  its instances run as numeric identities with no /etc/passwd entry, and ``make clean`` creates or leaves no
  ``agt-*`` user and no var/ directory.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from provisioning.drivers.local_volume_image import image_support
from tests.conftest import BASE_DIR, SESSION_TMP, wait_for

pytestmark = [pytest.mark.timeout(600)]

# What the test session sets for its own subprocesses and the stack must not inherit: it runs on its own.
_NOT_INHERITED = ("DATABASE_URL", "CELERY_BROKER_URL", "HEARTBEAT_REDIS_URL", "HEARTBEAT_KEY_PREFIX", "CACHE_URL",
                  "TENANT_DATABASE_URL", "TENANT_DATABASE_POOLER_URL", "LOCAL_VOLUME_ROOT", "LOCAL_OBJECTSTORE_ROOT",
                  "VAULT_KEK_KEYRING", "CELERY_TASK_DEFAULT_QUEUE", "TENANT_DATABASE_ALLOW_INSECURE_AUTH",
                  "DJANGO_SETTINGS_MODULE", "DEMO_PORT", "CONTROLPLANE_VAR_DIR", "KEEP_DB",
                  # The suite's own "off" (tests/conftest.py): the stack runs the product's default, volume images
                  # where this machine can loop-mount them, and `make clean` must unmount them.
                  "LOCAL_VOLUME_QUOTA")


def embedded_env(var: Path, **extra: str) -> dict[str, str]:
    """The environment of a new user's shell, with ``var`` as the var/ directory: no services configured."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith(("PYTEST_", "COV_"))}
    # The session's prefix: the tenants' names and their agt-* users' comments carry it, so the session's
    # clean-up removes whatever a failed test here leaves behind.
    env.update(CONTROLPLANE_VAR_DIR=str(var), PYTHONUNBUFFERED="1", TENANT_NAME_PREFIX=settings.TENANT_NAME_PREFIX)
    env.update(extra)
    return env


def free_web_port() -> int:
    sys.path.insert(0, str(BASE_DIR / "scripts"))
    try:
        from services import choose_port  # the rule the stack itself uses (the port and its peers' ports)
    finally:
        sys.path.remove(str(BASE_DIR / "scripts"))
    return choose_port(None, first=random.randint(20000, 40000))  # noqa: S311


@dataclass
class Stack:
    var: Path
    env: dict[str, str]
    port: int
    token: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def manage(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def make(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", "--no-print-directory", *args], cwd=BASE_DIR, env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)

    def supervisor(self):  # type: ignore[no-untyped-def]
        from supervisor.xmlrpc import SupervisorTransport

        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=SupervisorTransport(
            None, None, serverurl=f"unix://{self.var / 'run' / 'supervisor.sock'}")).supervisor

    def pid(self, program: str) -> int:
        return int(self.supervisor().getProcessInfo(program)["pid"])

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, method=method,  # noqa: S310 - our own local server
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def readyz(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.base + "/readyz", timeout=5) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def probe(self, code: str) -> dict:
        """Run ``code`` in a Django shell of the stack; it prints one JSON line last."""
        done = self.manage("shell", "-c", code)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    var = SESSION_TMP / "stack"
    port = free_web_port()
    env = embedded_env(var, DEMO_PORT=str(port),
                       # A pause after each onboarding step's effect keeps the worker busy with the onboarding long
                       # enough to be killed in the middle of it; a stalled run is resumed 3 s after it stopped
                       # moving (by the beat job every 15 s) instead of 30.
                       PROVISIONING_PAUSE_AFTER_EFFECT_S="2", WORKFLOW_STALL_AFTER_S="3")
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    token = subprocess.run([sys.executable, "manage.py", "create_operator", "stack-ops", "--name", "Stack Ops"],
                           cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip().splitlines()[-1]
    started = subprocess.run([sys.executable, "scripts/services.py", "start"], cwd=BASE_DIR, env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    yield Stack(var=var, env=env, port=port, token=token)
    subprocess.run([sys.executable, "scripts/services.py", "clean"], cwd=BASE_DIR, env=env, capture_output=True,
                   timeout=300, check=False)  # whatever the tests left running


def onboard(stack: Stack, slug: str) -> str:
    status, body = stack.api("POST", "/api/v1/tenants", {"slug": slug, "name": slug, "allow_no_release": True})
    assert status in (200, 202), body
    return body["id"]


def tenant(stack: Stack, tenant_id: str) -> dict:
    return stack.api("GET", f"/api/v1/tenants/{tenant_id}")[1]


@pytest.mark.django_db
def test_a_sigkilled_worker_is_restarted_and_onboarding_completes(stack, client, django_user_model, settings):
    # The staff overview, rendered here against the stack's heartbeats (its embedded Redis), while it is down.
    settings.HEARTBEAT_REDIS_URL = (f"unix://:{(stack.var / 'secrets' / 'redis-password').read_text().strip()}@"
                                    f"{stack.var / 'redis' / 'redis.sock'}?db=0")
    settings.HEARTBEAT_KEY_PREFIX = "cp:hb"
    client.force_login(django_user_model.objects.create_user("staff31", is_staff=True))
    wait_for(lambda: stack.readyz()[0] == 200, timeout=60, what="the stack ready (worker and beat heartbeats)")

    tenant_id = onboard(stack, "kill-mid-onboarding")
    wait_for(lambda: tenant(stack, tenant_id).get("resources"), timeout=90, what="the first resource")
    assert tenant(stack, tenant_id)["status"] == "provisioning"  # the worker is in the middle of the onboarding
    old = stack.pid("worker")
    os.kill(old, signal.SIGKILL)
    killed_at = time.monotonic()

    down: list[dict] = []
    overview = ""
    while time.monotonic() - killed_at < 60:
        status, body = stack.readyz()
        if status == 503:
            down.append(body)
            if not overview:
                overview = client.get("/dashboard/").content.decode()
        elif status == 200 and body["checks"]["worker"]["detail"].startswith("pid ") and \
                not body["checks"]["worker"]["detail"].startswith(f"pid {old},"):
            break
        time.sleep(0.1)
    back_after_s = time.monotonic() - killed_at
    assert down, "/readyz never answered 503 while the worker was down"
    assert f"the worker is down (pid {old} terminated by SIGKILL" in down[0]["detail"], down[0]
    assert down[0]["checks"]["worker"]["ok"] is False and down[0]["checks"]["beat"]["ok"] is True
    assert 'data-testid="incident-banner"' in overview, overview[:3000]
    assert re.search(r"the worker \(queue [^)]+\) is down since [\d-]+ [\d:]+ UTC \(pid \d+ terminated by SIGKILL",
                     overview), overview[:3000]
    assert 'data-testid="service-worker" data-state="down"' in overview, overview[:3000]
    new = stack.pid("worker")
    assert new != old and back_after_s < 30, (new, back_after_s)
    print(f"worker SIGKILLed: /readyz 503 for {len(down)} probes, ready again {back_after_s:.1f} s after the kill")

    body = wait_for(lambda: (t := tenant(stack, tenant_id))["status"] in ("ready", "failed") and t,
                    timeout=180, what="the onboarding finished after the restart")
    assert body["status"] == "ready", body.get("status_reason")

    # The restart on the record: an audit row (listed on the overview) and a line in var/log.
    restarts = (stack.var / "log" / "restarts.log").read_text()
    assert f"worker: pid {old} terminated by SIGKILL; the supervisor restarts it" in restarts, restarts
    seen = wait_for(lambda: stack.probe(
        "import json; from django.test import Client; from django.contrib.auth import get_user_model; "
        "from tenants.models import AuditLog; "
        "u, _ = get_user_model().objects.get_or_create(username='staff31', defaults={'is_staff': True}); "
        "c = Client(); c.force_login(u); page = c.get('/dashboard/').content.decode(); "
        "rows = [a.data for a in AuditLog.objects.filter(action='service.restart')]; "
        "print(json.dumps({'rows': rows, 'page': page}))") if f"restarted as pid {new}" in
        (stack.var / "log" / "restarts.log").read_text() else None, timeout=60, what="the restart recorded")
    row = next(r for r in seen["rows"] if r["old_pid"] == old)
    assert row["new_pid"] == new and row["reason"] == "terminated by SIGKILL" and row["service"] == "worker", row
    assert f"worker restarted (pid {old} terminated by SIGKILL; now pid {new}" in seen["page"], seen["page"][:3000]


def _stack_processes(stack: Stack) -> dict[int, str]:
    """Every live process of the stack: those whose environment or command line names its var/ directory, their
    descendants, and the instances (by their pid files; a sandboxed one has neither)."""
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(stack.var) in cmdline or proc.environ().get("CONTROLPLANE_VAR_DIR") == str(stack.var):
                found[proc.pid] = cmdline
                found.update({c.pid: " ".join(c.cmdline()) for c in proc.children(recursive=True)})
        except psutil.Error:
            continue
    for pidfile in (stack.var / "volumes").glob("*/.host/instance.pid"):
        try:
            proc = psutil.Process(int(pidfile.read_text()))
            found[proc.pid] = " ".join(proc.cmdline())
        except (ValueError, OSError, psutil.Error):
            pass
    return found


def _listening_ports(pids: set[int]) -> set[int]:
    return {c.laddr.port for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def _mounts_under(var: Path) -> list[str]:
    prefix = str(var.resolve()).rstrip("/") + "/"
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)]


def _agt_users() -> set[str]:
    return {entry.pw_name for entry in pwd.getpwall() if entry.pw_name.startswith("agt-")}


def _instance_uids(stack: Stack) -> set[int]:
    """The numeric identities the stack's instances run as: from LOCAL_INSTANCE_UID_BASE up, one per tenant, with
    no /etc/passwd entry (docs/security.md, 3k)."""
    return {folder.stat().st_uid for folder in [*(stack.var / "volumes").glob("*"),
                                                *(stack.var / "objectstore").glob("*/*")]
            if folder.stat().st_uid >= settings.LOCAL_INSTANCE_UID_BASE}


def test_make_stop_leaves_no_process_and_no_port_and_make_clean_no_user(stack):
    ready = stack.api("GET", "/api/v1/tenants?status=ready")[1].get("results") or []
    tenant_id = ready[0]["id"] if ready else onboard(stack, "stop-and-clean")  # the test above's, when it ran
    wait_for(lambda: tenant(stack, tenant_id)["status"] == "ready", timeout=180, what="a running instance")
    wait_for(lambda: any("agent_runtime.host" in c for c in _stack_processes(stack).values()), timeout=60,
             what="its agent-host running")
    processes = _stack_processes(stack)
    ports = _listening_ports(set(processes))
    # The web port and the peers': SMTP, payments, chat model, OAuth, the CRM's MCP server.
    assert {stack.port, *(stack.port + o for o in (25, 26, 27, 28, 29))} <= ports, (ports, processes)
    assert any("agent_runtime.host" in c for c in processes.values()), processes
    postmaster = [p for p, c in processes.items() if "postgres" in c and "-D" in c]
    assert postmaster, processes
    postgres = {postmaster[0], *(c.pid for c in psutil.Process(postmaster[0]).children())}
    uids = _instance_uids(stack)
    users_before = _agt_users()
    images = _mounts_under(stack.var)
    if image_support()[0] and os.geteuid() == 0:
        assert images, "LOCAL_VOLUME_QUOTA=auto (the default) made the tenant's volume an image mounted under var/"
    if os.geteuid() == 0 and subprocess.run(["which", "bwrap"], capture_output=True, check=False).returncode == 0:
        assert uids, "a sandboxed instance runs as its own numeric identity"
        known = {entry.pw_uid for entry in pwd.getpwall()}
        assert not uids & known, "an instance identity needs no /etc/passwd entry"

    kept = stack.make("stop", "KEEP_DB=1")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert re.search(r"postgresql\s+kept running \(pid \d+, KEEP_DB\)", kept.stdout), kept.stdout
    left = _stack_processes(stack)
    assert set(left) <= postgres, {p: c for p, c in left.items() if p not in postgres}
    assert postmaster[0] in left

    stopped = stack.make("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert re.search(r"postgresql\s+stopped \(pid \d+\)", stopped.stdout), stopped.stdout
    for what in ("worker", "beat", "web", "watcher", "crm", "supervisor", "redis", "pgbouncer", "instance "):
        assert re.search(rf"{what}\s*\S* ?stopped", kept.stdout + stopped.stdout), (what, kept.stdout)
    left = {p: c for p, c in _stack_processes(stack).items() if psutil.pid_exists(p)}
    assert not left, left
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in processes)
    held = ports & {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    assert not held, held
    again = stack.make("stop")
    assert "nothing was running" in again.stdout, again.stdout

    cleaned = stack.make("clean")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert _agt_users() <= users_before, "the stack created system users"  # identities are numbers, not users
    assert not stack.var.exists()
    assert not _mounts_under(stack.var), "make clean left a volume image mounted"
    if images:
        assert "unmounted" in cleaned.stdout, cleaned.stdout
