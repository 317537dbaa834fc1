"""Instances on a tenant database server whose record names a pooler (issue 16, item 1), end to end.

Real parts: a SCRAM PostgreSQL 15 (tests/pg_servers.py) as the tenant server, Debian's PgBouncer in transaction
mode in front of it authenticating tenant roles with SCRAM through ``auth_query`` (tests/pgbouncer.py: the auth
user and lookup function an operator installs), the control plane's onboarding on a real Celery worker, real
``agent-host`` processes in their sandboxes, real signals. Faults: PgBouncer restarted (SIGTERM, SIGKILL) and the
tenant server restarted (``pg_ctl restart -m fast``) while instances work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from provisioning.databases.servers import database_server_add, database_server_drain, settings_server_ensure
from provisioning.drivers.local_process import PID_FILE
from provisioning.fleet.instances import instance_submit_task
from provisioning.models import AgentInstance
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import BASE_DIR, SESSION_TMP, kill_session_instances, onboard_ready, wait_for
from tests.pg_servers import Server, running_scram_server
from tests.pgbouncer import Bouncer, install_auth_query, restart_postgres, start_pgbouncer
from vault.choices import DB_PASSWORD_CREDENTIAL
from vault.services import credential_reveal

pytestmark = pytest.mark.django_db(transaction=True)

AUTH_USER = "pgbouncer_auth"


@pytest.fixture(scope="module")
def tenant_server() -> Iterator[tuple[Server, Bouncer]]:
    with running_scram_server() as server:
        password = os.urandom(12).hex()
        install_auth_query(server.url("tenantdb"), auth_user=AUTH_USER, auth_password=password)
        bouncer = start_pgbouncer(server_host="127.0.0.1", server_port=server.port, databases=["tenantdb"],
                                  name="pooled-instances", auth_user=(AUTH_USER, password),
                                  settings={"default_pool_size": 2})
        try:
            yield server, bouncer
        finally:
            bouncer.stop()


@pytest.fixture
def lease_ttl_s() -> int:
    """The instances' AGENT_LEASE_TTL_S (a test parametrizes it to show what does not wait for it)."""
    return 4


@pytest.fixture
def fleet(tenant_server, sinks, worker_factory, live_server, lease_ttl_s) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The pooled server recorded (``database_servers add ... --pooler``) as the only active one, and a worker;
    instances reach the live server for credentials and heartbeats."""
    server, bouncer = tenant_server
    settings_server_ensure()
    database_server_drain(name="default", actor=SYSTEM)
    database_server_add(name="pooled", actor=SYSTEM, capacity=10,
                        dsn=server.passfile_dsn(),
                        pooler_dsn=f"host=127.0.0.1 port={bouncer.port} dbname=tenantdb")
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.5,AGENT_LEASE_TTL_S={lease_ttl_s},AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0")
    worker = worker_factory(INSTANCE_EXTRA_ENV=extra, CONTROL_PLANE_INTERNAL_URL=live_server.url,
                            LOCAL_EXIT_NOTICE="true")
    yield {"server": server, "bouncer": bouncer, "sinks": sinks, "worker": worker}
    kill_session_instances()


def _onboard_running(operator, slug: str) -> Tenant:  # type: ignore[no-untyped-def]
    tenant = onboard_ready(operator, slug)
    assert AgentInstance.objects.get(tenant=tenant).status == "running"
    return tenant


def _host_pid(tenant: Tenant) -> int:
    return int((Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / ".host" / PID_FILE).read_text())


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _query(server: Server, tenant: Tenant, text: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.url("tenantdb"), autocommit=True) as conn:
        return conn.execute(sql.SQL(text).format(s=sql.Identifier(tenant.resource_name)), args).fetchall()


def _payments(sinks: dict[str, str]) -> dict[str, int]:
    with urllib.request.urlopen(f"{sinks['payments']}/stats", timeout=5) as resp:
        return dict(json.loads(resp.read())["charges_by_key"])


def _done_steps(server: Server, tenant: Tenant) -> int:
    return len(_query(server, tenant, "SELECT 1 FROM {s}.step_events WHERE event = 'done'"))


def _each_once(server: Server, tenant: Tenant, tasks: int) -> None:
    """Every task done; each of its seven steps done once; its email and its payment committed once."""
    try:
        wait_for(lambda: _query(server, tenant, "SELECT count(*) FROM {s}.tasks WHERE status = 'done'")[0][0]
                 == tasks, timeout=120, what=f"{tenant.slug}: tasks done")
    except AssertionError:
        rows = _query(server, tenant, "SELECT status, blocked_reason, blocked_detail FROM {s}.tasks")
        raise AssertionError(f"{rows}\n{_host_log(tenant)[-3000:]}") from None
    done = _query(server, tenant, "SELECT task_id, step, count(*) FROM {s}.step_events WHERE event = 'done'"
                                  " GROUP BY task_id, step")
    assert len(done) == 7 * tasks and all(n == 1 for *_k, n in done), done
    effects = _query(server, tenant, "SELECT effect, state FROM {s}.effects ORDER BY id")
    assert sorted(effects) == sorted([("email", "committed"), ("payment", "committed")] * tasks), effects


def test_an_instance_on_a_pooled_server_runs_through_pgbouncer_and_keeps_one_writer(operator, fleet) -> None:
    server, bouncer = fleet["server"], fleet["bouncer"]
    tenant = _onboard_running(operator, "pooled")
    pid = _host_pid(tenant)
    env = _environ(pid)
    assert env["AGENT_DATABASE_POOLED"] == "1"
    dsn = psycopg.conninfo.conninfo_to_dict(env["AGENT_DATABASE_URL"])
    assert (dsn["port"], dsn["user"], "options" in dsn) == (str(bouncer.port), tenant.resource_name, False)

    before = _payments(fleet["sinks"])
    instance_submit_task(tenant=tenant, kind="demo", params={"step_sleep_s": 0.2}, actor=SYSTEM)  # CLI, pooled too
    _each_once(server, tenant, 1)
    assert len({k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}) == 1

    # Its sessions on the server are PgBouncer's server connections; the process talks to PgBouncer only.
    sessions = {r[0] for r in _query(server, tenant, "SELECT pid FROM pg_stat_activity WHERE usename = %s",
                                     tenant.resource_name)}
    assert sessions <= bouncer.server_pids(tenant.resource_name)
    ports = {c.raddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr}
    assert bouncer.port in ports and server.port not in ports

    # One writer: a second host with the instance's own environment waits on the live lease, then refuses...
    password = credential_reveal(tenant=tenant, name=DB_PASSWORD_CREDENTIAL, actor=SYSTEM)
    second_volume = SESSION_TMP / f"second-{tenant.resource_name}"
    second_volume.mkdir(mode=0o700)
    second = subprocess.run([sys.executable, "-m", "agent_runtime.host"], cwd=BASE_DIR, capture_output=True,
                            text=True, timeout=60, env={**env, "AGENT_VOLUME": str(second_volume)})
    assert second.returncode == 3 and "keeps renewing it" in second.stderr, second.stderr[-2000:]
    # ...and any connection that calls itself a host but is not the lease's holder has its writes refused.
    with psycopg.connect(bouncer.dsn("tenantdb", tenant.resource_name, password), autocommit=True,
                         prepare_threshold=None, application_name="agent-host:intruder") as intruder:
        with pytest.raises(psycopg.Error) as refused:
            intruder.execute("INSERT INTO tasks (id, kind, params) VALUES (gen_random_uuid(), 'demo', '{}')")
        assert refused.value.sqlstate == "AR001"
    assert _query(server, tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'") == [(1,)]
    assert _host_pid(tenant) == pid and psutil.pid_exists(pid)


def test_pgbouncer_restarted_under_load_the_hosts_reconnect_and_finish(operator, fleet) -> None:
    server, bouncer = fleet["server"], fleet["bouncer"]
    tenants = [_onboard_running(operator, f"bounce-{i}") for i in range(2)]
    pids = [_host_pid(t) for t in tenants]
    before = _payments(fleet["sinks"])
    for tenant in tenants:
        instance_submit_task(tenant=tenant, kind="demo", params={"step_sleep_s": 1.0, "search_s": 1.0},
                             actor=SYSTEM)
    for sig, steps in ((signal.SIGTERM, 1), (signal.SIGKILL, 4)):
        wait_for(lambda s=steps: all(_done_steps(server, t) >= s for t in tenants), timeout=60,
                 what=f"{steps} steps done")
        bouncer.restart(sig, down_s=1.0)  # mid-step for both: their connections are cut
    for tenant in tenants:
        _each_once(server, tenant, 1)
    new = {k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}
    assert sorted(new.values()) == [1, 1], new  # one charge per task at the provider: none lost, none twice
    # The same processes finished them: they reconnected; nothing restarted or recovered them.
    assert [_host_pid(t) for t in tenants] == pids and all(psutil.pid_exists(p) for p in pids)
    for tenant in tenants:
        assert "reconnected to the pooler" in _host_log(tenant)
    for tenant in tenants:
        assert _query(server, tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'") == [(1,)]


def test_the_tenant_server_restarted_under_load_the_host_reconnects_and_finishes(operator, fleet) -> None:
    server = fleet["server"]
    tenant = _onboard_running(operator, "restarted")
    pid = _host_pid(tenant)
    before = _payments(fleet["sinks"])
    instance_submit_task(tenant=tenant, kind="demo", params={"step_sleep_s": 1.0, "search_s": 1.0}, actor=SYSTEM)
    wait_for(lambda: _done_steps(server, tenant) >= 2, timeout=60, what="two steps done")
    started = _postmaster_start(server)
    restart_postgres(server.url("postgres"))
    assert _postmaster_start(server) > started  # it did go down: every server session of the pool ended
    _each_once(server, tenant, 1)
    assert list({k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}.values()) == [1]
    assert _host_pid(tenant) == pid and psutil.pid_exists(pid)
    assert _query(server, tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'") == [(1,)]
    healthy = wait_for(lambda: _health(tenant) == 200, timeout=20, what="healthy again")
    assert healthy


@pytest.mark.parametrize("lease_ttl_s", [30])
def test_a_killed_pooled_instance_recovers_in_seconds_without_waiting_out_its_lease(operator, fleet,
                                                                                   lease_ttl_s) -> None:
    """SIGKILL mid-task: its parent (the worker) notices, the recovery's stop ends the dead host's lease (the
    only lock through a pooler), so the new host takes over at once, not after the 30 s TTL; each step and the
    payment once."""
    from provisioning.models import RecoveryEvent

    server = fleet["server"]
    tenant = _onboard_running(operator, "pooled-killed")
    pid = _host_pid(tenant)
    before = _payments(fleet["sinks"])
    instance_submit_task(tenant=tenant, kind="demo", params={"step_sleep_s": 0.5}, actor=SYSTEM)
    wait_for(lambda: _done_steps(server, tenant) >= 2, timeout=60, what="two steps done")
    import time

    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    boots = "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'"
    try:
        wait_for(lambda: _query(server, tenant, boots) == [(2,)], timeout=lease_ttl_s - 10,
                 what="the new host booted before the dead one's lease would have expired")
    except AssertionError:
        from provisioning.models import WorkflowRun

        runs = [(r.kind, r.status, list(r.steps.values_list("name", "status", "error", "output")))
                for r in WorkflowRun.objects.filter(tenant=tenant)]
        raise AssertionError(f"{list(RecoveryEvent.objects.filter(tenant=tenant).values())}\n{runs}\n"
                             f"{_host_log(tenant)[-3000:]}\n{fleet['worker'].log()[-3000:]}") from None
    resumed_s = time.monotonic() - killed
    _each_once(server, tenant, 1)
    assert list({k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}.values()) == [1]
    event = RecoveryEvent.objects.get(tenant=tenant)
    assert event.reason == "dead" and "noticed by its parent" in event.detail, event.detail
    assert "waiting for the previous host's lease to expire" not in _host_log(tenant)
    print(f"\npooled SIGKILL recovery: new host booted {resumed_s:.1f} s after the kill (lease TTL {lease_ttl_s} s)")


def _host_log(tenant: Tenant) -> str:
    log = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / ".host" / "agent-host.log"
    return log.read_text(errors="replace") if log.exists() else ""


def _postmaster_start(server: Server) -> Any:
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


def _health(tenant: Tenant) -> int:
    port = (Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / ".host" / "http-port").read_text()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0
