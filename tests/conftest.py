"""Shared fixtures: real PostgreSQL (pytest-django's test database), real Celery workers, cleanup.

Roles are cluster-wide and the services outlive a run, so every name this session
creates carries a unique prefix and is dropped at the end, whatever happened.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from django.conf import settings

from controlplane.celery import app as celery_app

from . import tiers

RUN_ID = secrets.token_hex(4)
BASE_DIR = Path(settings.BASE_DIR)
SESSION_TMP = Path(tempfile.mkdtemp(prefix=f"cp-test-{RUN_ID}-"))

# Everything a test run creates outside the test database is namespaced by RUN_ID.
settings.TENANT_NAME_PREFIX = f"tt{RUN_ID}_"
settings.LOCAL_VOLUME_ROOT = SESSION_TMP / "volumes"
settings.LOCAL_OBJECTSTORE_ROOT = SESSION_TMP / "objectstore"
settings.VAULT_KEK_PROVIDER = "local"
settings.VAULT_KEK_KEYRING = "v1:" + base64.b64encode(os.urandom(32)).decode()
settings.CELERY_TASK_DEFAULT_QUEUE = f"cp-test-{RUN_ID}"
settings.WORKFLOW_RETRY_BACKOFF_S = 0.2
# The OAuth test peer listens on 127.0.0.1 and other tests name hosts this machine cannot resolve (no DNS here):
# the private-address check is off, except in the test that proves its refusal
# (tests/connections/test_connections_limits.py).
settings.OAUTH_ALLOW_PRIVATE_ADDRESSES = True
settings.HEARTBEAT_KEY_PREFIX = f"cp-test-{RUN_ID}:hb"
# Sandboxed instances run as LOCAL_INSTANCE_UID_BASE + their identity's number (provisioning/identities.py), and
# the numbers restart at 1 in every test database: two runs at once (`make test` splits the suite across xdist
# workers, each with its own database) would give two tenants one uid. Each run takes its own block of 2^16 uids.
settings.LOCAL_INSTANCE_UID_BASE = 2**20 + (int(RUN_ID, 16) % 4096) * 2**16
os.environ["LOCAL_INSTANCE_UID_BASE"] = str(settings.LOCAL_INSTANCE_UID_BASE)
# The exit notice (provisioning/recovery/exit_notice.py) is off unless a test turns it on: the sweep's tests must
# see the sweep do the detecting, and its own tests (tests/provisioning/test_recovery.py) make the test process the
# instance's parent.
settings.LOCAL_EXIT_NOTICE = False
# Volumes as loop-mounted images (LOCAL_VOLUME_QUOTA=auto) only where a test asks and unmounts them itself: a suite
# run leaves most tenants in place, and their mounts would outlive it on a shared machine. In the environment too,
# for every process a test starts (workers, the demo, the supervised stack).
settings.LOCAL_VOLUME_QUOTA = "off"
os.environ["LOCAL_VOLUME_QUOTA"] = "off"
# The instances of tests that are not about the network keep the machine's (LOCAL_INSTANCE_NETWORK=shared; the
# default `auto` would isolate them here: root, bwrap and socat are installed). They talk to peers of their own on
# 127.0.0.1 (payments, OAuth, MCP, SMTP, chat) at ports chosen per test, which an isolated instance reaches only when
# granted (LOCAL_INSTANCE_LOOPBACK_GRANTS, fixed before the worker starts), and every isolated instance costs three
# to four socat relays on a machine shared by several runs. The network's own tests set `isolated` (or `auto`)
# themselves: tests/provisioning/test_isolation_network.py, test_isolation_egress.py. In the environment too, for
# every process a test starts (workers, the demo, the supervised stack).
settings.LOCAL_INSTANCE_NETWORK = "shared"
os.environ["LOCAL_INSTANCE_NETWORK"] = "shared"
# The machine's PostgreSQL trusts local connections, so provisioning onto it needs the override (recorded on
# each database resource as "auth": "insecure-override"); subprocesses inherit it through os.environ.
# tests/provisioning/test_pg_auth_boundaries.py provisions onto a SCRAM server of its own without it.
settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = True
os.environ["TENANT_DATABASE_ALLOW_INSECURE_AUTH"] = "true"
# Chaos tests start workers with fault-injection knobs (PROVISIONING_PAUSE_AFTER_EFFECT_S and the like), which a
# process refuses without the test-only switch (controlplane/config_table.py); subprocesses inherit it.
os.environ["CONTROLPLANE_FAULT_INJECTION"] = "1"
_celery_conf = {"task_default_queue": settings.CELERY_TASK_DEFAULT_QUEUE}
celery_app.conf.update(_celery_conf)


def pytest_addoption(parser: pytest.Parser) -> None:
    tiers.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    tiers.register(config)
    tiers.install_recorder(config)
    tiers.install_report(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.assign(items)  # browser / e2e / slow (tests/tiers.py); `make test-fast` leaves those three out


def database_url() -> str:
    """URL of the (test) database this session uses, for subprocesses."""
    from django.db import connection

    s = connection.settings_dict
    host = s.get("HOST") or ""
    auth = quote(s.get("USER") or "postgres") + (":" + quote(s["PASSWORD"]) if s.get("PASSWORD") else "")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{s['NAME']}?host={quote(host, safe='')}"
    return f"postgresql://{auth}@{host or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=str(settings.CELERY_BROKER_URL),
        CELERY_TASK_DEFAULT_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        TENANT_NAME_PREFIX=settings.TENANT_NAME_PREFIX,
        LOCAL_VOLUME_ROOT=str(settings.LOCAL_VOLUME_ROOT),
        LOCAL_OBJECTSTORE_ROOT=str(settings.LOCAL_OBJECTSTORE_ROOT),
        VAULT_KEK_PROVIDER="local",
        VAULT_KEK_KEYRING=settings.VAULT_KEK_KEYRING,
        WORKFLOW_RETRY_BACKOFF_S=str(settings.WORKFLOW_RETRY_BACKOFF_S),
        HEARTBEAT_KEY_PREFIX=settings.HEARTBEAT_KEY_PREFIX,
        HEARTBEAT_REDIS_URL=settings.HEARTBEAT_REDIS_URL,
        LOCAL_EXIT_NOTICE="true" if settings.LOCAL_EXIT_NOTICE else "false",
        CONTROLPLANE_VAR_DIR=str(SESSION_TMP / "var"),
        PYTHONUNBUFFERED="1",
        # A beat or watcher SIGKILLed and started again by a test leads again within seconds, not 15 (its lease).
        LEADER_LEASE_S="3",
        LEADER_RENEW_S="0.5",
    )
    env.update(extra)
    return env


class Worker:
    """A real ``celery worker`` process (solo pool: the task runs in the process we signal)."""

    def __init__(self, **env: str) -> None:
        self.log_path = SESSION_TMP / f"worker-{secrets.token_hex(3)}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
             "--loglevel=INFO", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=BASE_DIR, env=subprocess_env(**env), stdout=self._log, stderr=subprocess.STDOUT,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def worker_factory() -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(**env: str) -> Worker:
        worker = Worker(**env)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate: Callable[[], object], *, timeout: float = 60, interval: float = 0.2, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def onboard_ready(operator, slug: str, *, timeout: float = 120):  # type: ignore[no-untyped-def]
    """Onboard a tenant through the real workflow (a worker must run), wait for ready, and give it the demo
    agent's SMTP credential; the tenant, refreshed."""
    from provisioning.workflows.onboarding import tenant_onboard
    from tenants.actors import SYSTEM
    from tenants.models import Tenant
    from vault.services import credential_put

    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug, actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=timeout, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", tenant.status_reason
    credential_put(tenant=tenant, name="smtp", value="smtp-secret", actor=SYSTEM)
    return tenant


def kill_session_instances() -> None:
    """Stop every agent-host this session started (found by their volume's pid files)."""
    for pidfile in Path(settings.LOCAL_VOLUME_ROOT).glob("*/.host/instance.pid"):
        try:
            proc = psutil.Process(int(pidfile.read_text()))
            # Most pid files name a host that died long ago (chaos tests kill them, a sleep stops them): its pid may
            # belong to anyone now, with pid_max at 32768 often to a PostgreSQL backend, whose SIGKILL restarts the
            # whole server under every other test on the machine, or to another session's agent-host. Only the
            # instance process of this very volume is killed.
            volume = proc.environ().get("AGENT_VOLUME")
            if not volume or Path(volume).resolve() != pidfile.parent.parent.resolve():
                continue
            proc.kill()
            proc.wait(5)
        except (ValueError, psutil.Error, FileNotFoundError):
            pass
    from provisioning.drivers.local_fork import fork_server_pids, started_fork_servers

    # LOCAL_INSTANCE_LAUNCH=fork: the session's fork servers too (its workers' and this process's own).
    for pid in {*fork_server_pids(SESSION_TMP), *started_fork_servers()}:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(5)


def _drop_session_roles() -> None:
    import psycopg
    from psycopg import sql

    from provisioning.drivers.pg_admin import admin_conninfo

    try:
        conn = psycopg.connect(**admin_conninfo(), autocommit=True)
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc):  # the tenant database is made by the first onboarding: none ran
            return
        raise
    with conn:
        roles = [r[0] for r in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (settings.TENANT_NAME_PREFIX + "%",)
        )]
        for role in roles:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _instance_users() -> set[str]:
    """The per-tenant system users of this session's sandboxed instances (provisioning/drivers/local_sandbox.py):
    their comment names the tenant's resource name, which carries this session's prefix. Other sessions (a
    benchmark, another run) make users on the same machine at the same time; theirs are never touched."""
    import pwd

    from provisioning.drivers.local_sandbox import USER_PREFIX

    return {entry.pw_name for entry in pwd.getpwall() if entry.pw_name.startswith(USER_PREFIX)
            and settings.TENANT_NAME_PREFIX in entry.pw_gecos}


def _drop_session_users(before: set[str]) -> None:
    """Users are machine-wide like roles: remove the ones this session's tenants left behind."""
    for name in sorted(_instance_users() - before):
        subprocess.run(["userdel", name], capture_output=True, check=False)
        subprocess.run(["groupdel", name], capture_output=True, check=False)


def _drop_session_cgroups() -> None:
    """Instance cgroups (provisioning/drivers/local_limits.py) are machine-wide too: this session's tenants' names
    carry its prefix. The kernel removes only empty ones, and the instances were killed just before."""
    if os.geteuid() != 0:
        return
    from provisioning.drivers.local_limits import cgroup_layout

    for parent in cgroup_layout().parents.values():
        for path in parent.glob(f"{settings.TENANT_NAME_PREFIX}*"):
            for _ in range(20):  # a killed instance's last task may take a moment to leave the cgroup
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.fixture(scope="session", autouse=True)
def _session_cleanup(django_db_setup, django_db_blocker) -> Iterator[None]:  # type: ignore[no-untyped-def]
    users_before = _instance_users()
    yield
    kill_session_instances()
    _drop_session_users(users_before)
    _drop_session_cgroups()
    with django_db_blocker.unblock():
        _drop_session_roles()
    if settings.HEARTBEAT_REDIS_URL:  # Redis outlives the run: drop this session's heartbeat keys
        import redis

        client = redis.Redis.from_url(settings.HEARTBEAT_REDIS_URL)
        for key in client.scan_iter(f"{settings.HEARTBEAT_KEY_PREFIX}:*"):
            client.delete(key)
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


@pytest.fixture
def operator(db):  # type: ignore[no-untyped-def]
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    return operator_create(slug=f"op-{secrets.token_hex(3)}", name="Test Operator", actor=SYSTEM)


@pytest.fixture
def make_token(db):  # type: ignore[no-untyped-def]
    from tenants.actors import SYSTEM
    from tenants.tokens import operator_token_issue

    def issue(operator, scopes=None) -> str:  # type: ignore[no-untyped-def]
        return operator_token_issue(operator=operator, actor=SYSTEM, scopes=scopes).plaintext

    return issue


def host_path_roots() -> list[str]:
    """The directories no API answer may name (docs/api.md), as paths and as ``file://`` URLs contain them."""
    return sorted({str(Path(p).resolve()) for p in (settings.VAR_DIR, settings.LOCAL_OBJECTSTORE_ROOT,
                                                      settings.RELEASES_ROOT, settings.LOCAL_VOLUME_ROOT)})


def assert_no_host_path(response) -> None:  # type: ignore[no-untyped-def]
    """Fails naming the root and the request when a (non-streaming) answer carries a path under a host root."""
    if getattr(response, "streaming", False):
        return
    text = response.content.decode("utf-8", "replace").replace("\\/", "/")
    for root in host_path_roots():
        assert root not in text, (f"{response.request.get('REQUEST_METHOD')} {response.request.get('PATH_INFO')} "
                                  f"answered with a host path under {root}: {text[:600]}")


@pytest.fixture
def api(operator, make_token):  # type: ignore[no-untyped-def]
    """The operator API's test client. Every answer it gets is scanned for host paths (issue 32): a test of any
    endpoint fails as soon as an answer names the var root, the object store's or the releases' root."""
    from rest_framework.test import APIClient

    class NoHostPathClient(APIClient):
        def request(self, **kwargs):  # type: ignore[no-untyped-def]
            response = super().request(**kwargs)
            assert_no_host_path(response)
            return response

    client = NoHostPathClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator)}")
    client.operator = operator
    return client


@pytest.fixture(scope="module")
def sinks():  # type: ignore[no-untyped-def]
    """The demo agent's irreversible-effect peers: an SMTP sink and a payment provider stub (one pair per test
    module: tests/provisioning/test_recovery.py, tests/releases/test_release_rollouts.py)."""
    procs, urls = [], {}
    for name, module in (("smtp", "agent_examples.peers.smtp"), ("payments", "agent_examples.peers.payments")):
        port_file = SESSION_TMP / f"{name}-{secrets.token_hex(4)}.port"  # a fresh file per module: never a dead port
        env = {**os.environ, "AGENT_SINK_PORT_FILE": str(port_file),
               "AGENT_SMTP_SINK_LOG": str(SESSION_TMP / "smtp.jsonl")}
        procs.append(subprocess.Popen([sys.executable, "-m", module], env=env, cwd=BASE_DIR,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(port_file.exists, timeout=20, what=f"{name} sink")
        wait_for(lambda pf=port_file: pf.read_text().strip(), timeout=5)
        port = port_file.read_text().strip()
        urls[name] = f"smtp://127.0.0.1:{port}" if name == "smtp" else f"http://127.0.0.1:{port}"
    yield urls
    for p in procs:
        p.kill()
        p.wait()
