"""Scale to zero (issue 16, item 2): real agent-hosts started by a real Celery worker, real PostgreSQL.

An idle instance is put to sleep by the periodic job (its process gone, marked asleep), the recovery sweep and
the exit notice leave it alone, and a message wakes it and is answered with nothing lost; a storm of 20
messages boots it once; a message that arrives while the instance is still stopping waits for the stop and
then wakes it (one process at a time, never asleep with a message waiting); an asleep instance can be stopped
on purpose and its tenant deprovisioned. A busy instance (a reply in flight) is never put to sleep.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from psycopg import sql
from rest_framework.test import APIClient

from conversations.choices import InboxStatus
from conversations.models import InboxItem
from instances.client import forget_tenant
from provisioning.choices import InstanceStatus, WakeOutcome
from provisioning.drivers.local_process import live_host_pid
from provisioning.drivers.pg_admin import admin_connect
from provisioning.fleet.actions import instance_stop_planned
from provisioning.fleet.sleep import instance_sleep, sleep_sweep
from provisioning.models import AgentInstance, InstanceWake, RecoveryEvent
from provisioning.recovery.exit_notice import on_exit
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.recovery.sweep import recovery_candidates, recovery_sweep
from provisioning.resources.spec import tenant_spec
from provisioning.tasks import instance_sleep_sweep_task
from provisioning.workflows.onboarding import tenant_deprovision, tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import kill_session_instances, wait_for
from tests.conversation_helpers import CHAT_HOLD_NAME, chat_hold, chat_release, post_json, sse_events

pytestmark = pytest.mark.django_db(transaction=True)

EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_CONFIG": json.dumps({"chat_hold_file": CHAT_HOLD_NAME})}
IDLE_S = 2.0


@pytest.fixture
def fleet(worker_factory, settings):  # type: ignore[no-untyped-def]
    settings.INSTANCE_EXTRA_ENV = dict(EXTRA_ENV)
    settings.INSTANCE_IDLE_SUSPEND_S = IDLE_S
    settings.RUNTIME_STOP_GRACE_S = 10.0
    # The worker is the parent of the hosts it starts and hears of their exits: a sleep must not look like a death.
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in EXTRA_ENV.items()),
                            INSTANCE_IDLE_SUSPEND_S=str(IDLE_S), LOCAL_EXIT_NOTICE="true", RUNTIME_STOP_GRACE_S="10")
    chat_release()
    yield worker
    chat_release()
    kill_session_instances()


def _onboard(operator, slug: str, worker) -> Tenant:  # type: ignore[no-untyped-def]
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug, actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", (tenant.status_reason, worker.log()[-2000:])
    forget_tenant(str(tenant.pk))
    return tenant


def _messages(tenant: Tenant, thread: str = "web") -> str:
    return f"/api/v1/tenants/{tenant.pk}/threads/{thread}/messages"


def _stream(api: APIClient, url: str) -> list[tuple[str, str]]:
    resp = api.get(url, HTTP_ACCEPT="text/event-stream")
    assert resp.status_code == 200, resp.content
    return sse_events(b"".join(resp.streaming_content))


def _schema_rows(tenant: Tenant, query: str) -> list[tuple]:
    with admin_connect(autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(sql.Identifier(tenant.resource_name))).fetchall()


def _messages_stored(tenant: Tenant) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in _schema_rows(tenant, "SELECT role, content FROM {}.messages ORDER BY seq")]


def _boots(tenant: Tenant) -> int:
    return len(_schema_rows(tenant, "SELECT id FROM {}.host_events WHERE kind = 'boot'"))


def _instance(tenant: Tenant) -> AgentInstance:
    return AgentInstance.objects.get(tenant=tenant)


def _asleep(tenant: Tenant) -> bool:
    instance = _instance(tenant)
    return instance.status == InstanceStatus.ASLEEP and instance.asleep_at is not None


def _idle(seconds: float = IDLE_S + 0.5) -> None:
    """Let the idle window pass (the schema's newest write and the last inbox item must be older than it)."""
    time.sleep(seconds)


def test_an_idle_instance_sleeps_is_left_alone_by_the_sweep_and_a_message_wakes_it(api, fleet):
    tenant = _onboard(api.operator, "sleepy", fleet)
    spec = tenant_spec(tenant)
    first = post_json(api, _messages(tenant), {"content": "before the nap"})
    assert first.status_code == 201, first.content
    assert _stream(api, first.json()["reply_url"])[-1][0] == "end"

    # Busy (a reply is in flight: its task is running) is never idle, however old the last activity.
    chat_hold()
    held = post_json(api, _messages(tenant), {"content": "hold on"})
    assert held.status_code == 201
    wait_for(lambda: len(_messages_stored(tenant)) >= 3, timeout=20, what="the held question stored")
    _idle()
    assert instance_sleep(instance=_instance(tenant), idle_s=0).startswith("busy"), "slept mid-reply"
    assert _instance(tenant).status == InstanceStatus.RUNNING
    chat_release()
    assert _stream(api, held.json()["reply_url"])[-1][0] == "end"
    assert live_host_pid(spec) is not None

    # The periodic job, run by the worker, puts it to sleep once the window has passed.
    _idle()
    pid = live_host_pid(spec)
    instance_sleep_sweep_task.delay()
    wait_for(lambda: _asleep(tenant), timeout=30, what=f"asleep (worker log: {fleet.log_path})")
    assert live_host_pid(spec) is None
    assert not _alive(pid)
    instance = _instance(tenant)
    assert instance.status_reason.startswith("asleep")

    # The recovery sweep: even with a stale heartbeat on record (its last beat), an asleep instance is no candidate.
    heartbeat_store().record(str(instance.pk), {"status": "stopped", "progress_seq": 1}, now=time.time() - 3600)
    assert str(instance.pk) not in [str(i.pk) for i, _, _ in recovery_candidates()]
    assert recovery_sweep().dispatched == []
    # The exit notice (its parent, the worker, heard the exit too: nothing was started) and a late one here.
    assert on_exit(str(tenant.pk), pid=pid, returncode=0).startswith("not meant to run (asleep")
    time.sleep(1.0)
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists(), fleet.log()[-2000:]
    assert _asleep(tenant)
    boots = _boots(tenant)

    # A message wakes it: 202 at once, answered after the boot and read-back, everything before still there.
    sent = post_json(api, _messages(tenant), {"content": "wake up"}, **{"Idempotency-Key": "wake-1"})
    assert sent.status_code == 202, sent.content
    events = _stream(api, sent.json()["reply_url"])
    assert events[-2][0] == "reply" and json.loads(events[-2][1])["content"] == "echo: wake up", events
    # The reply may come before the wake's own bookkeeping: the inbox delivers to a starting instance as soon as
    # it answers, while the wake's start still waits for its /readyz (seen on a loaded machine).
    wait_for(lambda: _instance(tenant).status == InstanceStatus.RUNNING, timeout=30, what="running after the wake")
    wait_for(lambda: InstanceWake.objects.get(tenant=tenant).outcome != WakeOutcome.PENDING, timeout=30,
             what="the wake finished")
    assert _boots(tenant) == boots + 1
    assert _messages_stored(tenant) == [("user", "before the nap"), ("assistant", "echo: before the nap"),
                                         ("user", "hold on"), ("assistant", "echo: hold on"),
                                         ("user", "wake up"), ("assistant", "echo: wake up")]
    wake = InstanceWake.objects.get(tenant=tenant)
    assert wake.outcome == WakeOutcome.SUCCEEDED and wake.trigger == "message"
    assert wake.boot_s is not None and 0 < wake.boot_s < 30
    wait_for(lambda: InstanceWake.objects.get(pk=wake.pk).delivered_at, timeout=10, what="delivery recorded")
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()

    # The dashboard's fleet page and the operator API show it.
    staff = Client()
    staff.force_login(User.objects.create_user("sleep-staff", password="pw-123456789", is_staff=True))
    html = staff.get("/dashboard/fleet/").content.decode()
    card = html.split('data-testid="fleet-sleep"', 1)[1].split("</section>", 1)[0]
    assert 'data-testid="wake-p50"' in card and " s</dd>" in card.split('data-testid="wake-p50"', 1)[1][:40]
    assert tenant.slug in card
    instance_sleep(instance=_instance(tenant), idle_s=0)
    assert api.get(f"/api/v1/tenants/{tenant.pk}").json()["instance"]["status"] == "asleep"
    html = staff.get("/dashboard/fleet/").content.decode()
    assert 'data-testid="sleep-asleep">1<' in html


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"  # a zombie (its parent reaps it) is gone


def test_a_storm_of_twenty_messages_boots_the_instance_once_and_each_is_answered(api, fleet):
    tenant = _onboard(api.operator, "storm", fleet)
    assert instance_sleep(instance=_instance(tenant), idle_s=0) == "asleep"
    boots = _boots(tenant)
    token = api._credentials["HTTP_AUTHORIZATION"]
    answers: list[int] = []
    barrier = threading.Barrier(20)

    def send(n: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=token)
        try:
            barrier.wait(timeout=30)
            answers.append(post_json(client, _messages(tenant, f"t{n}"), {"content": f"storm {n}"}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == 20 and set(answers) <= {201, 202}, answers
    assert answers.count(202) >= 1
    wait_for(lambda: InboxItem.objects.filter(tenant=tenant, status=InboxStatus.DELIVERED).count() == 20,
             timeout=90, what=f"20 delivered (worker log: {fleet.log_path})")
    wait_for(lambda: len(_messages_stored(tenant)) == 40, timeout=60, what="20 answers")
    assert _boots(tenant) == boots + 1
    assert InstanceWake.objects.filter(tenant=tenant).count() == 1
    assert InstanceWake.objects.get(tenant=tenant).outcome == WakeOutcome.SUCCEEDED
    contents = sorted(c for _, c in _messages_stored(tenant))
    assert contents == sorted([f"storm {n}" for n in range(20)] + [f"echo: storm {n}" for n in range(20)])

    # The safety net: an item waiting for an asleep instance whose wake was never asked for (written here straight
    # into the inbox, as a lost request would leave it) is woken by the periodic job and delivered.
    assert instance_sleep(instance=_instance(tenant), idle_s=0) == "asleep"
    stray = InboxItem.objects.create(tenant=tenant, kind="message", thread="stray", payload={"content": "stray"})
    assert sleep_sweep().woken == [str(_instance(tenant).pk)]
    wait_for(lambda: InboxItem.objects.get(pk=stray.pk).status == InboxStatus.DELIVERED, timeout=60,
             what=f"the stray item delivered (worker log: {fleet.log_path})")
    assert InstanceWake.objects.filter(tenant=tenant, trigger="sweep", outcome=WakeOutcome.SUCCEEDED).count() == 1
    assert _boots(tenant) == boots + 2


def test_a_message_while_the_instance_is_still_stopping_waits_for_the_stop_then_wakes_it(api, fleet, settings):
    tenant = _onboard(api.operator, "stopping", fleet)
    spec = tenant_spec(tenant)
    _idle()
    pid = live_host_pid(spec)
    boots = _boots(tenant)
    os.kill(pid, signal.SIGSTOP)  # holds its SIGTERM: the stop takes as long as we say
    outcome: list[str] = []

    def sleeper() -> None:
        try:
            outcome.append(instance_sleep(instance=_instance(tenant), idle_s=IDLE_S))
        finally:
            connection.close()

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        wait_for(lambda: _instance(tenant).status == InstanceStatus.ASLEEP, timeout=20, what="falling asleep")
        assert _instance(tenant).asleep_at is None  # still stopping
        sent = post_json(api, _messages(tenant), {"content": "not yet asleep"})
        assert sent.status_code == 202, sent.content
        wait_for(lambda: InstanceWake.objects.filter(tenant=tenant).exists(), timeout=10, what="a wake asked for")
        time.sleep(2.0)  # the worker has the wake task by now: it must wait for the stop, not start a second host
        assert live_host_pid(spec) == pid
        assert _instance(tenant).status == InstanceStatus.ASLEEP and _instance(tenant).asleep_at is None
        assert InstanceWake.objects.get(tenant=tenant).outcome == WakeOutcome.PENDING
    finally:
        os.kill(pid, signal.SIGCONT)
    thread.join(timeout=30)
    assert outcome == ["asleep"]
    wait_for(lambda: _instance(tenant).status == InstanceStatus.RUNNING, timeout=60,
             what=f"woken after the stop (worker log: {fleet.log_path})")
    new_pid = live_host_pid(spec)
    assert new_pid is not None and new_pid != pid and not _alive(pid)
    events = _stream(api, sent.json()["reply_url"])
    assert events[-2][0] == "reply" and json.loads(events[-2][1])["content"] == "echo: not yet asleep", events
    assert _boots(tenant) == boots + 1
    assert InboxItem.objects.get(pk=sent.json()["inbox"]["id"]).status == InboxStatus.DELIVERED
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()


def test_an_asleep_instance_can_be_stopped_on_purpose_and_its_tenant_deprovisioned(api, fleet):
    tenant = _onboard(api.operator, "retire", fleet)
    assert instance_sleep(instance=_instance(tenant), idle_s=0) == "asleep"
    instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="maintenance")
    assert _instance(tenant).status == InstanceStatus.STOPPED
    assert live_host_pid(tenant_spec(tenant)) is None
    # Stopped on purpose is not asleep: a message waits in the inbox and wakes nothing.
    held = post_json(api, _messages(tenant), {"content": "anyone?"})
    assert held.status_code == 202
    assert sleep_sweep().woken == [] and not InstanceWake.objects.filter(tenant=tenant).exists()

    other = _onboard(api.operator, "retire-asleep", fleet)
    assert instance_sleep(instance=_instance(other), idle_s=0) == "asleep"
    tenant_deprovision(tenant=other, actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=other.pk).status in ("deleted", "failed"), timeout=120,
             what=f"deprovisioned (worker log: {fleet.log_path})")
    assert Tenant.objects.get(pk=other.pk).status == "deleted", Tenant.objects.get(pk=other.pk).status_reason
    assert live_host_pid(tenant_spec(other)) is None


def test_a_task_submitted_straight_into_the_schema_wakes_the_asleep_instance_and_runs(api, fleet):
    """``manage.py instance submit`` (the CLI writes the task into the schema, not through the inbox) wakes it."""
    from django.core.management import call_command

    tenant = _onboard(api.operator, "submitted", fleet)
    assert instance_sleep(instance=_instance(tenant), idle_s=0) == "asleep"
    boots = _boots(tenant)
    call_command("instance", "submit", str(tenant.pk), "--kind", "multi", "--params", '{"emails": 0}')
    try:
        wait_for(lambda: _schema_rows(tenant, "SELECT count(*) FROM {}.tasks WHERE status = 'done'")[0][0] == 1,
                 timeout=60, what="the submitted task done after a wake")
    except AssertionError:
        raise AssertionError(f"{list(InstanceWake.objects.filter(tenant=tenant).values())} "
                             f"{_schema_rows(tenant, 'SELECT status, kind FROM {}.tasks')} {_instance(tenant).status}"
                             f"\n{fleet.log()[-3000:]}") from None
    wake = InstanceWake.objects.get(tenant=tenant)
    assert wake.trigger == "submit"
    wait_for(lambda: InstanceWake.objects.get(pk=wake.pk).outcome == WakeOutcome.SUCCEEDED, timeout=30,
             what="the wake recorded")
    assert _boots(tenant) == boots + 1 and _instance(tenant).status == InstanceStatus.RUNNING


def test_an_asleep_instance_is_drift_checked_and_drift_found_is_repaired_by_a_recovery_that_wakes_it(api, fleet):
    """The drift check's window covers asleep instances too (not their runtime, stopped on purpose)."""
    import shutil

    from provisioning.drivers.local_objectstore import LocalObjectStoreDriver
    from provisioning.recovery.sweep import drift_check

    tenant = _onboard(api.operator, "drifted", fleet)
    assert instance_sleep(instance=_instance(tenant), idle_s=0) == "asleep"
    assert drift_check() == [] and _instance(tenant).drift_checked_at is not None  # looked at, nothing wrong
    assert _asleep(tenant)
    boots = _boots(tenant)
    prefix = LocalObjectStoreDriver()._prefix(tenant_spec(tenant))
    shutil.rmtree(prefix)  # its object-store prefix lost while it sleeps
    assert drift_check() == [str(_instance(tenant).pk)]
    event = RecoveryEvent.objects.get(tenant=tenant)
    assert event.reason == "drift" and "objectstore" in event.detail, event.detail
    wait_for(lambda: RecoveryEvent.objects.get(pk=event.pk).outcome == "succeeded", timeout=90,
             what=f"the drift recovery (worker log: {fleet.log_path})")
    assert prefix.is_dir() and _instance(tenant).status == InstanceStatus.RUNNING and _boots(tenant) == boots + 1


def test_the_openapi_schema_lists_asleep_as_an_instance_status():
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    status = components["InstanceOutput"]["properties"]["status"]
    assert "asleep" in status["description"]
    refs = [status.get("$ref")] + [s.get("$ref") for s in status.get("allOf", [])]
    enum = next(components[r.rsplit("/", 1)[-1]]["enum"] for r in refs if r) if any(refs) else status["enum"]
    assert "asleep" in enum and "running" in enum
