"""Moving a tenant's schema between two real PostgreSQL servers: mid-task, and with the worker killed at every step.

The machine's server holds tenants by default; the second is Debian's PostgreSQL 15 with SCRAM
(``tests/pg_servers.py``), recorded with a passfile DSN. What must hold, whatever is killed when: the tenant's
rows are neither lost nor duplicated, its placement never names a server without a verified copy, the source
is dropped only after the switch, and the task it was running resumes on the target with each effect once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from psycopg import sql

from controlplane.errors import Conflict
from controlplane.jobs import jobs_resume_stalled
from provisioning.databases.move import database_move_start, schema_fingerprint
from provisioning.databases.servers import database_server_add, settings_server_ensure, tenant_database_server
from provisioning.drivers.pg_admin import admin_connect
from provisioning.fleet.instances import instance_start, instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance, DatabaseMove, WorkflowRun, WorkflowStep
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.pg_servers import Server, running_scram_server

pytestmark = pytest.mark.django_db(transaction=True)

# The tables an idle instance does not write: what a move must carry over exactly (host_events and the lease
# change with every boot, so they are compared as "nothing lost", not equal).
DURABLE = ("tasks", "checkpoints", "step_events", "effects", "messages")


@pytest.fixture(scope="module")
def second_server() -> Iterator[Server]:
    with running_scram_server() as server:
        yield server


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.3,AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=4")
    env = {"CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": extra, "WORKFLOW_STALL_AFTER_S": "2",
           "RUNTIME_STOP_GRACE_S": "5"}
    yield {"env": env, "sinks": sinks, "worker": worker_factory(**env), "factory": worker_factory}
    kill_session_instances()


def _rows(server: str, tenant: Tenant, query: str) -> list[tuple]:
    with admin_connect(server, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(tenant.resource_name))).fetchall()


def _schema_on(server: str, tenant: Tenant) -> bool:
    with admin_connect(server, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (tenant.resource_name,)).fetchone() is not None


def _loaded(server: str, tenant: Tenant) -> bool:
    """The copy's tables are there and owned by the tenant: the load and the ownership hand-over both ran."""
    with admin_connect(server, autocommit=True) as conn:
        return bool(conn.execute(
            "SELECT count(*) > 0 AND bool_and(pg_get_userbyid(c.relowner) = n.nspname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (tenant.resource_name,)).fetchone()[0])


def _durable(server: str, tenant: Tenant) -> dict[str, list[int]]:
    found = schema_fingerprint(server, tenant.resource_name)
    return {k: v for k, v in found.items() if k in DURABLE}


def _payments(sinks: dict[str, str]) -> dict[str, int]:
    with urllib.request.urlopen(f"{sinks['payments']}/stats", timeout=5) as resp:
        return json.loads(resp.read())["charges_by_key"]


def _finished(run_id: object, timeout: float = 120) -> WorkflowRun:
    wait_for(lambda: WorkflowRun.objects.get(pk=run_id).status in ("succeeded", "failed"), timeout=timeout,
             what="move finished")
    return WorkflowRun.objects.get(pk=run_id)


def test_a_tenant_moved_mid_task_resumes_on_the_target_with_each_effect_once(operator, fleet, second_server) -> None:
    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    tenant = onboard_ready(operator, "mover")
    assert tenant_database_server(tenant).name == "default"
    before = _payments(fleet["sinks"])
    instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.3, "step_sleep_s": 0.5}, actor=SYSTEM)
    wait_for(lambda: len(_rows("default", tenant, "SELECT 1 FROM {s}.step_events WHERE event = 'done'")) >= 2,
             timeout=60, what="two steps done")

    move = database_move_start(tenant=tenant, target="second", actor=SYSTEM)
    with pytest.raises(Conflict, match="being moved already"):
        database_move_start(tenant=tenant, target="second", actor=SYSTEM)
    run = _finished(move.run_id)
    assert run.status == "succeeded", (run.error, fleet["worker"].log()[-3000:])
    move.refresh_from_db()
    print(f"\nmove mid-task: {move.copied_bytes} bytes, unavailable "
          f"{(move.resumed_at - move.drained_at).total_seconds():.2f} s (drained -> resumed)")

    assert tenant_database_server(tenant).name == "second"
    assert not _schema_on("default", tenant) and _schema_on("second", tenant)
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=90, what="task done")
    done = _rows("second", tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
    assert done and all(n == 1 for _, n in done), done
    new = {k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}
    assert len(new) == 1 and list(new.values()) == [1], new
    boots = _rows("second", tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'")[0][0]
    assert boots >= 2  # the first boot on the source, copied over, and the one on the target
    # The tenant's role on the source is gone with its schema; on the target it logs in with its own password.
    with admin_connect("default", autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (tenant.resource_name,)).fetchone() is None
    assert AgentInstance.objects.get(tenant=tenant).status == "running"


def _paused_effect_done(step: str, tenant: Tenant, source: str, target: str):  # type: ignore[no-untyped-def]
    """A predicate: the step's external effect is visible (the worker then sleeps before recording the step)."""
    def role_fenced() -> bool:
        with admin_connect(source, autocommit=True) as conn:
            return bool(conn.execute("SELECT NOT rolcanlogin FROM pg_roles WHERE rolname = %s",
                                     (tenant.resource_name,)).fetchone()[0])

    checks = {
        "drain": role_fenced,
        "copy": lambda: bool(_loaded(target, tenant)),
        "verify": lambda: DatabaseMove.objects.filter(tenant=tenant).exclude(verified={}).exists(),
        "switch": lambda: tenant_database_server(tenant).name == target,
        "resume": lambda: AgentInstance.objects.get(tenant=tenant).status == "running",
        "drop_source": lambda: not _schema_on(source, tenant),
    }
    return checks[step]


def test_a_move_killed_at_every_step_resumes_and_never_loses_duplicates_or_half_points(
        operator, fleet, second_server, settings) -> None:  # type: ignore[no-untyped-def]
    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    tenant = onboard_ready(operator, "killed-mover")
    instance_submit_task(tenant=tenant, kind="demo", params={}, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=90, what="task done")
    fleet["worker"].stop()
    source, target = "default", "second"
    for step in ("drain", "copy", "verify", "switch", "resume", "drop_source"):
        expected = _durable(source, tenant)
        doomed = fleet["factory"](**fleet["env"], PROVISIONING_PAUSE_AFTER_EFFECT_S="60", PROVISIONING_PAUSE_STEP=step)
        move = database_move_start(tenant=tenant, target=target, actor=SYSTEM)
        wait_for(lambda m=move, s=step: WorkflowStep.objects.filter(run_id=m.run_id, name=s, status="running").exists(),
                 timeout=90, what=f"step {step} running")
        wait_for(_paused_effect_done(step, tenant, source, target), timeout=60, what=f"{step}'s effect")
        time.sleep(0.5)
        doomed.kill(signal.SIGKILL)
        assert WorkflowStep.objects.get(run_id=move.run_id, name=step).status == "running"
        # Killed with the step's effect done but not recorded: the tenant points at a complete, verified copy.
        placed = tenant_database_server(tenant).name
        assert placed == (target if step in ("switch", "resume", "drop_source") else source), (step, placed)
        assert _durable(placed, tenant) == expected, step
        if step in ("drain", "copy", "verify"):
            with pytest.raises(Conflict, match="being moved"):
                instance_start(tenant=tenant, actor=SYSTEM)  # nothing may write the source mid-move

        worker = fleet["factory"](**fleet["env"])
        settings.WORKFLOW_STALL_AFTER_S = 0  # what the beat job does after the stall timeout, at once
        assert jobs_resume_stalled() >= 1  # the job kernel's one sweep
        run = _finished(move.run_id)
        assert run.status == "succeeded", (step, run.error, worker.log()[-3000:])
        assert WorkflowStep.objects.get(run_id=move.run_id, name=step).attempts == 2
        assert tenant_database_server(tenant).name == target
        assert _durable(target, tenant) == expected, step  # nothing lost, nothing doubled
        assert not _schema_on(source, tenant), step
        assert AgentInstance.objects.get(tenant=tenant).status == "running", step
        worker.stop()
        source, target = target, source  # the next round moves it back


def test_a_move_to_an_unreachable_server_fails_and_leaves_the_tenant_running_where_it_was(operator, fleet) -> None:
    settings_server_ensure()
    # Nothing listens on port 1: every connection to this server is refused, as for a server that died.
    database_server_add(name="gone", actor=SYSTEM, dsn="host=127.0.0.1 port=1 dbname=tenantdb user=postgres")
    tenant = onboard_ready(operator, "stays-put")
    with pytest.raises(Conflict, match="on default already"):
        database_move_start(tenant=tenant, target="default", actor=SYSTEM)
    move = database_move_start(tenant=tenant, target="gone", actor=SYSTEM)
    run = _finished(move.run_id, timeout=180)
    assert run.status == "failed" and "copy" in run.error, run.error
    assert "password" not in run.error
    tenant.refresh_from_db()
    assert tenant.status == "ready"  # a failed move is not a failed tenant
    assert tenant_database_server(tenant).name == "default"
    # The source was unfenced and the instance started again: it takes and finishes a task there.
    wait_for(lambda: AgentInstance.objects.get(tenant=tenant).status == "running", timeout=60, what="restarted")
    instance_submit_task(tenant=tenant, kind="demo", params={}, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=90, what="task done")
    with admin_connect("default", autocommit=True) as conn:
        assert conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s",
                            (tenant.resource_name,)).fetchone()[0]


def test_an_asleep_tenant_moves_asleep_and_its_next_wake_boots_on_the_target(operator, fleet, second_server) -> None:
    from provisioning.fleet.sleep import instance_sleep, instance_wake_request

    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    tenant = onboard_ready(operator, "sleeper")
    instance = AgentInstance.objects.get(tenant=tenant)
    wait_for(lambda: instance_sleep(instance=instance, idle_s=0) == "asleep", timeout=30, what="asleep")
    move = database_move_start(tenant=tenant, target="second", actor=SYSTEM)
    # A wake asked for mid-move waits for the switch (its task retries), then boots on the target.
    assert instance_wake_request(tenant=tenant, trigger="test")
    run = _finished(move.run_id)
    assert run.status == "succeeded", run.error
    assert tenant_database_server(tenant).name == "second" and not _schema_on("default", tenant)
    wait_for(lambda: AgentInstance.objects.get(tenant=tenant).status == "running", timeout=90, what="woken")
    boots = _rows("second", tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'")[0][0]
    assert boots >= 2  # the one before the move, copied, and the wake's on the target


def test_a_load_whose_input_is_cut_short_commits_nothing(operator) -> None:  # type: ignore[no-untyped-def]
    """The move's copy streams pg_dump into psql and writes COMMIT last, after pg_dump exited 0. A worker killed
    mid-stream ends psql's input early: with the invocation the copy uses, that rolls everything back (no half
    copy on the target); ``--single-transaction``, which it avoids, would have committed the partial input."""
    import secrets
    import subprocess

    from provisioning.databases.archives import _psql_load_command

    settings_server_ensure()
    tenant = Tenant.objects.create(operator=operator, slug=f"cut-{secrets.token_hex(3)}", name="Cut")
    argv, env = _psql_load_command(tenant, "default")
    schema = f"cut_{secrets.token_hex(4)}"
    partial = f"BEGIN;\nCREATE SCHEMA {schema};\nCREATE TABLE {schema}.t (x int);\nINSERT INTO {schema}.t VALUES (1);\n"

    def exists() -> bool:
        with admin_connect("default", autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None

    try:
        done = subprocess.run(argv, input=partial.encode(), env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert not exists(), "a load cut short before its COMMIT left a schema behind"
        single = [*argv, "--single-transaction"]
        subprocess.run(single, input=partial.removeprefix("BEGIN;\n").encode(), env=env, capture_output=True,
                       timeout=60, check=True)
        assert exists()  # the invocation the copy must not use: it commits at end of input, however it ended
    finally:
        with admin_connect("default", autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_copy_whose_load_fails_early_says_why_at_once_and_keeps_nothing(operator, second_server) -> None:  # type: ignore[no-untyped-def]
    """psql stops at the first error while pg_dump still has megabytes to write: the copy fails at once with
    psql's error (pg_dump is stopped, not waited for while it blocks on a pipe nobody reads) and nothing of the
    load stays on the target."""
    import secrets

    from controlplane.errors import ProvisioningError
    from provisioning.databases.archives import schema_copy

    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    tenant = Tenant.objects.create(operator=operator, slug=f"early-{secrets.token_hex(3)}", name="Early")
    ident = sql.Identifier(tenant.resource_name)
    with admin_connect("default", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL("CREATE TABLE {}.a_first (x int)").format(ident))
        conn.execute(sql.SQL("CREATE TABLE {}.big AS SELECT g, repeat('x', 200) AS pad"
                             " FROM generate_series(1, 100000) g").format(ident))  # ~20 MB of COPY lines
    with admin_connect("second", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL("CREATE TABLE {}.a_first (y text)").format(ident))  # the load's first error
    try:
        started = time.monotonic()
        with pytest.raises(ProvisioningError, match="loading the schema failed: .*already exists"):
            schema_copy(tenant, source="default", target="second", timeout_s=60)
        assert time.monotonic() - started < 30
        with admin_connect("second", autocommit=True) as conn:
            tables = conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                                  " WHERE n.nspname = %s AND relkind = 'r'", (tenant.resource_name,)).fetchall()
        assert tables == [("a_first",)]  # only what was there before: the failed load kept nothing
    finally:
        for server in ("default", "second"):
            with admin_connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
