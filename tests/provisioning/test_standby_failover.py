"""A standby in another failure domain (issue 16, item 3): synchronous replication, failover with nothing lost.

Real parts only: a primary and a streaming standby of Debian's PostgreSQL 15 made with ``pg_basebackup -R``
(``tests/pg_servers.py``), a tenant provisioned on the primary by a real Celery worker, the demo agent running in
a real ``agent-host`` against it with the SMTP sink and the payment provider as its effect peers. The primary is
SIGKILLed (postmaster and every backend) mid-task, ``database_server_failover`` promotes the standby and restarts
the instance, and the task must finish there with every step done once and each effect performed once.

The counter-case shows the setting is what matters: with the walreceiver stopped, an asynchronous primary
acknowledges a commit the promoted standby never has, while a synchronous one never acknowledges it at all.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from psycopg import sql

from controlplane.errors import Conflict
from provisioning.databases.failover import database_server_failover
from provisioning.databases.servers import (
    database_server_add,
    database_server_drain,
    settings_server_ensure,
    tenant_database_server,
)
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance, DatabaseServer
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tests.conftest import SESSION_TMP, kill_session_instances, wait_for
from tests.pg_servers import ReplicatedPair, Server, running_replicated_pair
from vault.services import credential_put

pytestmark = pytest.mark.django_db(transaction=True)


def _add_replicated(pair: ReplicatedPair, name: str = "replicated") -> DatabaseServer:
    return database_server_add(name=name, actor=SYSTEM, dsn=pair.primary.passfile_dsn(),
                               standby_dsn=pair.standby.passfile_dsn())


def _rows(server: Server, schema: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.url("tenantdb"), autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), args).fetchall()


@pytest.fixture
def sync_pair() -> Iterator[ReplicatedPair]:
    with running_replicated_pair(synchronous=True) as pair:
        yield pair


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    """Instances that reach the control plane (credentials) and the effect peers; a worker for onboarding."""
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.3,AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=10")
    # The instance this process restarts after the failover gets the same environment as the worker's.
    settings.INSTANCE_EXTRA_ENV = dict(item.split("=", 1) for item in extra.split(","))
    settings.CONTROL_PLANE_INTERNAL_URL = live_server.url
    worker = worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, INSTANCE_EXTRA_ENV=extra)
    yield {"worker": worker, "sinks": sinks}
    kill_session_instances()


def _charges(sinks: dict[str, str]) -> dict[str, int]:
    with urllib.request.urlopen(f"{sinks['payments']}/stats", timeout=5) as resp:
        return dict(json.loads(resp.read())["charges_by_key"])


def _emails(subject: str) -> int:
    log = SESSION_TMP / "smtp.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if json.loads(line)["subject"] == subject)


def test_a_task_survives_losing_its_primary_and_finishes_on_the_promoted_standby(operator, fleet, sync_pair):
    settings_server_ensure()
    _add_replicated(sync_pair)
    database_server_drain(name="default", actor=SYSTEM)  # placement picks the replicated server
    tenant, _ = tenant_onboard(operator=operator, slug="replicated", name="Replicated",
                               actor=SYSTEM, allow_no_release=True)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", (tenant.status_reason, fleet["worker"].log()[-2000:])
    assert tenant_database_server(tenant).name == "replicated"
    credential_put(tenant=tenant, name="smtp", value="smtp-secret", actor=SYSTEM)
    schema = tenant.resource_name
    charges_before = _charges(fleet["sinks"])

    task_id = instance_submit_task(tenant=tenant, kind="demo", actor=SYSTEM,
                                   params={"search_s": 0.2, "step_sleep_s": 0.6})
    # 'start' of pay is written after send_email's transaction (its checkpoint, its done event, the email's
    # committed outcome) returned to the host: a commit the primary acknowledged. Kill at once, mid-step.
    wait_for(lambda: _rows(sync_pair.primary, schema, "SELECT 1 FROM {s}.step_events WHERE step = 'pay'"),
             timeout=90, interval=0.01, what="the pay step started")
    acknowledged = _rows(sync_pair.primary, schema,
                         "SELECT step FROM {s}.step_events WHERE event = 'done' ORDER BY id")
    checkpoint = _rows(sync_pair.primary, schema, "SELECT max(id) FROM {s}.checkpoints")[0][0]
    killed_at = sync_pair.kill_primary()
    assert [s for (s,) in acknowledged][:5] == ["plan", "search", "write_files", "scan", "send_email"]

    result = database_server_failover(name="replicated", actor=SYSTEM)
    failed_over = time.monotonic() - killed_at
    assert (result.promoted, result.swapped, result.restarted, result.failed) == (True, True, ["replicated"], {})
    server = DatabaseServer.objects.get(name="replicated")
    assert server.dsn == sync_pair.standby.passfile_dsn() and server.standby_dsn == ""
    new_primary = sync_pair.standby

    # The instance booted on the promoted standby and took the task up from its last committed checkpoint.
    boots = _rows(new_primary, schema, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'")[0][0]
    assert boots >= 2
    wait_for(lambda: _rows(new_primary, schema, "SELECT 1 FROM {s}.step_events WHERE step = 'pay'"
                           " AND event = 'start' OFFSET 1"), timeout=60, interval=0.01, what="pay resumed")
    resumed = time.monotonic() - killed_at
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=90, what="task done")

    resumed_from = _rows(new_primary, schema, "SELECT min(id) FROM {s}.checkpoints WHERE id > %s", checkpoint)[0][0]
    assert _rows(new_primary, schema, "SELECT 1 FROM {s}.checkpoints WHERE id = %s", checkpoint), \
        "the last acknowledged checkpoint is missing on the promoted standby"
    assert resumed_from is not None  # the resumed run wrote its checkpoints after the acknowledged one
    # Every step done exactly once, across the two hosts and the two servers; the acknowledged ones were not re-run.
    done = Counter(s for (s,) in _rows(new_primary, schema, "SELECT step FROM {s}.step_events WHERE event = 'done'"))
    assert done == Counter(["plan", "search", "write_files", "scan", "send_email", "pay", "snapshot"]), done
    starts = Counter(s for (s,) in _rows(new_primary, schema, "SELECT step FROM {s}.step_events"
                                                             " WHERE event = 'start'"))
    assert all(starts[s] == 1 for s in ("plan", "search", "write_files", "scan", "send_email")), starts
    # The email once, the payment once (the provider's count by idempotency key), both committed in the ledger.
    assert _emails(f"Report {task_id}") == 1
    new_charges = {k: v for k, v in _charges(fleet["sinks"]).items() if k not in charges_before}
    assert list(new_charges.values()) == [1], new_charges
    effects = _rows(new_primary, schema, "SELECT effect, state FROM {s}.effects ORDER BY id")
    assert sorted(effects) == [("email", "committed"), ("payment", "committed")]
    assert AgentInstance.objects.get(tenant=tenant).status == "running"

    # Run again (as after a crash once the record was swapped): nothing to promote, nothing restarted twice.
    again = database_server_failover(name="replicated", actor=SYSTEM)
    assert (again.promoted, again.swapped, again.restarted, again.already_on_new_primary) == (
        False, False, [], ["replicated"])
    audit = AuditLog.objects.get(action="database_server.failover")
    assert audit.data["from"].endswith(f"/{sync_pair.primary.port}/tenantdb")
    assert audit.data["to"].endswith(f"/{new_primary.port}/tenantdb") and audit.data["forced"] is False
    assert sync_pair.primary.password not in json.dumps(audit.data)
    print(f"\nfailover: primary SIGKILLed -> standby promoted, record swapped, instance restarted in "
          f"{failed_over:.2f} s (record switched {result.switched_s:.2f} s into the call); task resumed (the "
          f"interrupted step started again on the new primary) {resumed:.2f} s after the kill")


def _commit_with_streaming_stopped(pair: ReplicatedPair) -> tuple[bool, float]:
    """Stop the standby's walreceiver, then commit one row on the primary; kill the primary 3 s later.
    Returns whether the commit was acknowledged before the kill, and how long it took."""
    with psycopg.connect(pair.primary.url("tenantdb"), autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY)")  # acknowledged in both modes: the standby streams
    wait_for(lambda: _standby_has_table(pair), timeout=30, interval=0.05, what="the table on the standby")
    pair.stop_streaming()
    outcome: dict[str, Any] = {}

    def commit() -> None:
        started = time.monotonic()
        try:
            with psycopg.connect(pair.primary.url("tenantdb"), autocommit=True) as conn:
                conn.execute("INSERT INTO ledger VALUES (1)")
            outcome["acknowledged"] = time.monotonic() - started
        except psycopg.Error as exc:
            outcome["error"] = type(exc).__name__

    writer = threading.Thread(target=commit)
    writer.start()
    writer.join(3)
    acknowledged = "acknowledged" in outcome
    pair.kill_primary()
    writer.join(30)
    return acknowledged, float(outcome.get("acknowledged", 0.0))


def _standby_has_table(pair: ReplicatedPair) -> bool:
    with psycopg.connect(pair.standby.url("tenantdb"), autocommit=True) as conn:
        return conn.execute("SELECT to_regclass('ledger') IS NOT NULL").fetchone()[0]


@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
def test_without_synchronous_replication_an_acknowledged_commit_is_lost_with_the_primary(synchronous):
    with running_replicated_pair(synchronous=synchronous) as pair:
        _add_replicated(pair)
        acknowledged, took = _commit_with_streaming_stopped(pair)
        result = database_server_failover(name="replicated", actor=SYSTEM)
        assert result.promoted and result.swapped
        with psycopg.connect(pair.standby.url("tenantdb"), autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
            present = conn.execute("SELECT count(*) FROM ledger").fetchone()[0] == 1
    if synchronous:
        # The primary never said yes: a commit the standby had not flushed was never acknowledged to anyone.
        assert not acknowledged and not present
    else:
        # The primary said yes at once, and the promoted standby has never heard of it: the tail is lost.
        assert acknowledged and took < 1.0 and not present


def test_failover_refuses_split_brain_and_converges_when_run_again(sync_pair):
    server = _add_replicated(sync_pair)
    with pytest.raises(Conflict, match="still answers"):
        database_server_failover(name="replicated", actor=SYSTEM)
    with psycopg.connect(sync_pair.standby.url("tenantdb"), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True  # nothing was promoted
    server.refresh_from_db()
    assert server.standby_dsn and not AuditLog.objects.filter(action="database_server.failover").exists()

    # A crash between the promotion and the swap leaves a promoted standby behind a record that still names
    # the dead primary: the next run skips the promotion and finishes.
    sync_pair.kill_primary()
    with psycopg.connect(sync_pair.standby.url("tenantdb"), autocommit=True) as conn:
        assert conn.execute("SELECT pg_promote()").fetchone()[0] is True
    out = StringIO()
    call_command("database_servers", "failover", "replicated", stdout=out)
    assert "failed over to 127.0.0.1/" in out.getvalue() and "standby was already promoted" in out.getvalue()
    server.refresh_from_db()
    assert server.dsn == sync_pair.standby.passfile_dsn() and server.standby_dsn == ""
    call_command("database_servers", "failover", "replicated", stdout=out)  # and once more: nothing to do
    assert AuditLog.objects.filter(action="database_server.failover").count() == 1

    database_server_add(name="lonely", actor=SYSTEM, dsn=sync_pair.standby.passfile_dsn().replace(
        "dbname=tenantdb", "dbname=controlplane"))
    with pytest.raises(CommandError, match="names no standby"):
        call_command("database_servers", "failover", "lonely", stdout=out)
    with pytest.raises(CommandError, match="TENANT_DATABASE_URL"):
        call_command("database_servers", "failover", settings_server_ensure().name, stdout=out)
