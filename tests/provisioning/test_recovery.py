"""Scheduled recovery end to end: real agent-host processes, real signals, real PostgreSQL and Redis.

Instances heartbeat to a live control plane (pytest-django's live server); the sweep and the
drift check are the same functions beat runs; recoveries run on a real Celery worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from controlplane.periodic import periodic_jobs_sync
from provisioning.choices import RecoveryOutcome
from provisioning.databases.archives import schema_archive
from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.fleet.instances import instance_kill, instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance, RecoveryEvent, WorkflowRun, WorkflowStep
from provisioning.recovery.heartbeats import heartbeat_store
from provisioning.recovery.sweep import drift_check, recovery_retry, recovery_sweep
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tests.conftest import BASE_DIR, kill_session_instances, onboard_ready, subprocess_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_ENV = {
    "RECOVERY_STOP_GRACE_S": "2",
    "RECOVERY_BACKOFF_BASE_S": "0.1",
    "RECOVERY_MAX_FAILURES": "3",
    "RECOVERY_VERIFY_TIMEOUT_S": "30",
    "WORKFLOW_STALL_AFTER_S": "2",
}


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    """Point instances at the live server for heartbeats; start a worker with fast recovery settings."""
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.3,AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=4")
    settings.HEARTBEAT_TIMEOUT_S = 2.5
    settings.PROGRESS_STALL_TIMEOUT_S = 6
    env = {**WORKER_ENV, "CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": extra}
    worker = worker_factory(**env)
    yield {"worker": worker, "env": env, "sinks": sinks, "live_server": live_server}
    kill_session_instances()  # this test's tenants are flushed from the database: their instances must go too


def _events(tenant: Tenant, sql_text: str) -> list[tuple]:
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        return conn.execute(sql.SQL(sql_text).format(s=sql.Identifier(tenant.resource_name))).fetchall()


def _sweep_until_dispatched(timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = recovery_sweep()
        if result.dispatched:
            return result.dispatched
        time.sleep(0.3)
    raise AssertionError("the sweep dispatched nothing")


def _wait_recovered(tenant: Tenant, timeout: float = 90) -> RecoveryEvent:
    def finished() -> RecoveryEvent | None:
        event = RecoveryEvent.objects.filter(tenant=tenant).order_by("-id").first()
        return event if event and event.outcome not in (RecoveryOutcome.PENDING, RecoveryOutcome.RUNNING) else None

    event = wait_for(finished, timeout=timeout, what="recovery finished")
    assert isinstance(event, RecoveryEvent)
    return event


def _host_pids(tenant: Tenant) -> list[int]:
    volume = str(Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name)
    pids = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if (proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["cwd"] == volume
                    and (proc.info["cmdline"] or [])[1:3] == ["-m", "agent_runtime.host"]):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def _payments(sinks: dict[str, str]) -> dict[str, int]:
    with urllib.request.urlopen(f"{sinks['payments']}/stats", timeout=5) as resp:
        return json.loads(resp.read())["charges_by_key"]


def test_sigkill_mid_task_is_detected_recovered_and_resumed_without_repeating_effects(operator, fleet):
    tenant = onboard_ready(operator, "crashy")
    before = _payments(fleet["sinks"])
    task = instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.3, "step_sleep_s": 0.5},
                                actor=SYSTEM)
    wait_for(lambda: len(_events(tenant, "SELECT 1 FROM {s}.step_events WHERE event = 'done'")) >= 2,
             timeout=60, what="two steps done")
    killed = instance_kill(tenant=tenant, actor=SYSTEM)
    killed_at = time.monotonic()
    dispatched = _sweep_until_dispatched()
    instance = AgentInstance.objects.get(tenant=tenant)
    assert dispatched == [str(instance.pk)]
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, (event.detail, fleet["worker"].log()[-2000:])
    assert event.reason == "dead"
    assert event.stopped_at and event.resumed_at and event.from_checkpoint
    assert event.steps_lost is not None and event.steps_lost <= 1
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=60, what="task done")
    assert time.monotonic() - killed_at < 90
    assert killed not in _host_pids(tenant) and len(_host_pids(tenant)) == 1
    # Each step completed once; the payment and the email happened exactly once.
    done_steps = _events(tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
    assert done_steps and all(n == 1 for _, n in done_steps)
    new = {k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}
    assert len(new) == 1 and list(new.values()) == [1], new
    effects = _events(tenant, "SELECT effect, state FROM {s}.effects ORDER BY id")
    assert sorted(effects) == [("email", "committed"), ("payment", "committed")]
    tenant.refresh_from_db()
    assert tenant.status == "ready"
    assert task


def test_an_exit_is_noticed_by_the_instances_parent_and_recovered_with_no_sweep(operator, fleet, settings):
    """Issue 16, recovery in seconds: the process that started the instance waits on it; a SIGKILL starts the
    recovery at once. Nothing here runs the sweep, so the heartbeat timeout cannot be what noticed it."""
    from provisioning.fleet.actions import instance_restart

    tenant = onboard_ready(operator, "exits")
    settings.LOCAL_EXIT_NOTICE = True
    instance_restart(tenant=tenant, actor=SYSTEM)  # started again by this process, which is now its parent
    before = _payments(fleet["sinks"])
    instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.3, "step_sleep_s": 0.5}, actor=SYSTEM)
    wait_for(lambda: len(_events(tenant, "SELECT 1 FROM {s}.step_events WHERE event = 'done'")) >= 2,
             timeout=60, what="two steps done")
    from django.utils import timezone

    killed_at = timezone.now()
    killed = instance_kill(tenant=tenant, actor=SYSTEM)
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, (event.detail, fleet["worker"].log()[-2000:])
    assert event.reason == "dead" and "noticed by its parent" in event.detail, event.detail
    assert event.resumed_at is not None
    print(f"\nexit notice: detected {(event.detected_at - killed_at).total_seconds():.2f} s after the SIGKILL, "
          f"resumed {(event.resumed_at - killed_at).total_seconds():.2f} s after it")
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=60, what="task done")
    assert killed not in _host_pids(tenant) and len(_host_pids(tenant)) == 1
    done_steps = _events(tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
    assert done_steps and all(n == 1 for _, n in done_steps)
    new = {k: v for k, v in _payments(fleet["sinks"]).items() if k not in before}
    assert list(new.values()) == [1], new
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1


def test_the_exit_notice_leaves_planned_stops_and_recovering_instances_alone(operator, fleet):
    from provisioning.recovery.exit_notice import on_exit

    tenant = onboard_ready(operator, "notice")
    AgentInstance.objects.filter(tenant=tenant).update(status="stopped")
    assert on_exit(str(tenant.pk), pid=1, returncode=0).startswith("not meant to run (stopped")
    AgentInstance.objects.filter(tenant=tenant).update(status="running")
    assert on_exit(str(tenant.pk), pid=1, returncode=0) == "another host runs"  # it is still up
    assert on_exit("00000000-0000-0000-0000-000000000000", pid=1, returncode=0) == "gone"
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()


def test_sigstop_hang_is_detected_killed_and_restarted(operator, fleet):
    tenant = onboard_ready(operator, "hangy")
    pid = _host_pids(tenant)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        _sweep_until_dispatched()
        event = _wait_recovered(tenant)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, event.detail
    assert event.reason == "hung"
    # A hung host's stop waits RECOVERY_HUNG_STOP_GRACE_S (1 s), not the worker's RECOVERY_STOP_GRACE_S (2 s
    # here, 5 s by default), before the SIGKILL.
    stop = WorkflowStep.objects.get(run__tenant=tenant, run__kind="recover", name="stop")
    assert (stop.finished_at - stop.started_at).total_seconds() < float(WORKER_ENV["RECOVERY_STOP_GRACE_S"])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert len(_host_pids(tenant)) == 1


def test_deleted_volume_is_detected_as_drift_and_repaired(operator, fleet):
    import shutil

    tenant = onboard_ready(operator, "drifty")
    volume = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name
    shutil.rmtree(volume)
    assert drift_check() == [str(AgentInstance.objects.get(tenant=tenant).pk)]
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, event.detail
    assert event.reason == "drift" and any(r.startswith("volume") for r in event.repaired)
    assert volume.is_dir() and (volume.stat().st_mode & 0o777) == 0o700
    assert len(_host_pids(tenant)) == 1
    assert drift_check() == []


def test_dropped_schema_is_restored_from_its_latest_archive(operator, fleet):
    tenant = onboard_ready(operator, "schemy")
    instance_submit_task(tenant=tenant, kind="demo", params={}, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=60, what="task done")
    schema_archive(tenant=tenant, label="backup")
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(tenant.resource_name)))
    assert drift_check()
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, event.detail
    assert any("restored from archive" in r for r in event.repaired)
    # The history came back: the finished task is there, owned by the tenant's role.
    assert instance_task_summary(tenant=tenant)["tasks"].get("done") == 1
    owners = _events(tenant, "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = '" + tenant.resource_name
                     + "'")
    assert owners == [(tenant.resource_name,)]
    functions = _events(tenant, "SELECT DISTINCT pg_get_userbyid(p.proowner) FROM pg_proc p JOIN pg_namespace n"
                        " ON n.oid = p.pronamespace WHERE n.nspname = '" + tenant.resource_name + "'")
    assert functions == [(tenant.resource_name,)]  # the runtime's fence function too


def test_dropped_schema_without_archive_fails_the_tenant_loudly(operator, fleet):
    tenant = onboard_ready(operator, "lost")
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(tenant.resource_name)))
    assert drift_check()
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.FAILED
    tenant.refresh_from_db()
    assert tenant.status == "failed" and "no archive" in tenant.status_reason
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (tenant.resource_name,)).fetchone()
    assert exists is None  # never an empty schema posing as the real history


def test_crash_looping_instance_is_quarantined_not_restarted_forever(operator, fleet):
    tenant = onboard_ready(operator, "loopy")
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.agent_schema_version (version) VALUES (999)").format(
            sql.Identifier(tenant.resource_name)))
    instance_kill(tenant=tenant, actor=SYSTEM)
    instance = AgentInstance.objects.get(tenant=tenant)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        instance.refresh_from_db()
        if instance.status == "quarantined":
            break
        recovery_sweep()
        time.sleep(0.3)
    assert instance.status == "quarantined", list(RecoveryEvent.objects.filter(tenant=tenant).values("outcome"))
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 3
    tenant.refresh_from_db()
    assert tenant.status == "degraded" and "quarantined" in tenant.status_reason
    time.sleep(1)
    assert recovery_sweep().dispatched == []  # no more automatic restarts
    # Staff's one-click retry starts exactly one more recovery.
    recovery_retry(instance=instance, actor=SYSTEM)
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 4


def test_worker_and_beat_killed_during_a_recovery_still_recover_once(operator, fleet, worker_factory):
    tenant = onboard_ready(operator, "sturdy")
    fleet["worker"].stop()
    doomed = worker_factory(**fleet["env"], PROVISIONING_PAUSE_AFTER_EFFECT_S="30", PROVISIONING_PAUSE_STEP="stop")
    periodic_jobs_sync()
    beat_env = subprocess_env(**fleet["env"])
    beat_cmd = [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO", "--pidfile=",
                "--scheduler", "controlplane.leases.beat:LeaderScheduler"]
    beat = subprocess.Popen(beat_cmd, cwd=BASE_DIR, env=beat_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        instance_kill(tenant=tenant, actor=SYSTEM)
        # Beat's sweep finds it on its own; the doomed worker stops the instance, then pauses.
        wait_for(lambda: RecoveryEvent.objects.filter(tenant=tenant, stopped_at__isnull=False).exists(),
                 timeout=60, what="recovery stopped the instance")
        doomed.kill(signal.SIGKILL)
        beat.kill()
        beat.wait()
        beat = subprocess.Popen(beat_cmd, cwd=BASE_DIR, env=beat_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        worker_factory(**fleet["env"])
        event = _wait_recovered(tenant, timeout=120)
    finally:
        beat.kill()
        beat.wait()
    assert event.outcome == RecoveryOutcome.SUCCEEDED, event.detail
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1
    assert WorkflowRun.objects.filter(tenant=tenant, kind="recover").count() == 1
    assert len(_host_pids(tenant)) == 1


def test_rolling_restart_drains_each_instance_cleanly_one_at_a_time(operator, fleet):
    from provisioning.fleet.rolling import rolling_restart_start
    from provisioning.models import RollingRestart

    tenants = [onboard_ready(operator, f"roll-{i}") for i in range(3)]
    before = {t.pk: _host_pids(t) for t in tenants}
    rollout = rolling_restart_start(actor=SYSTEM, concurrency=1, reason="runtime upgrade")
    wait_for(lambda: RollingRestart.objects.get(pk=rollout.pk).status in ("succeeded", "failed"), timeout=180,
             what="rolling restart finished")
    rollout.refresh_from_db()
    items = list(rollout.items.order_by("stopped_at"))
    assert rollout.status == "succeeded", [i.error for i in items]
    assert len(items) == 3 and all(i.status == "done" and i.clean_shutdown for i in items)
    # Concurrency 1: each instance was back before the next one was stopped.
    for earlier, later in zip(items, items[1:], strict=False):
        assert earlier.started_at <= later.stopped_at
    for t in tenants:
        now = _host_pids(t)
        assert len(now) == 1 and now != before[t.pk]
        assert len(_events(t, "SELECT 1 FROM {s}.host_events WHERE kind = 'clean_shutdown'")) == 1
    assert RecoveryEvent.objects.filter(tenant__in=tenants).count() == 0


def test_recovery_events_are_listed_for_the_operator_and_exported_as_metrics(operator, fleet, api, client,
                                                                              django_user_model):
    tenant = onboard_ready(api.operator, "metered")
    instance_kill(tenant=tenant, actor=SYSTEM)
    _sweep_until_dispatched()
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.SUCCEEDED
    listed = api.get(f"/api/v1/tenants/{tenant.pk}/recoveries").json()
    assert listed["count"] == 1 and listed["results"][0]["reason"] == "dead"
    assert listed["results"][0]["time_to_recover_s"] > 0
    assert client.get("/metrics").status_code == 401
    staff = django_user_model.objects.create_user("ops", password="pw-123456789", is_staff=True)
    client.force_login(staff)
    body = client.get("/metrics").content.decode()
    assert 'controlplane_recoveries_total{outcome="succeeded",reason="dead"} 1.0' in body
    assert "controlplane_time_to_recover_seconds_count 1.0" in body
    assert "controlplane_instances_quarantined 0.0" in body


def test_suspend_resume_and_restart_through_the_api(operator, fleet, make_token, settings):
    """Issue 17: the API's lifecycle actions return at once (202) and a worker does the stopping and starting;
    a suspended instance stays down (the sweep leaves it alone), resume and restart bring it back, and none of
    it is recorded as a recovery."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator)}")
    tenant = onboard_ready(operator, "lifecycle")
    instance = AgentInstance.objects.get(tenant=tenant)
    url = f"/api/v1/tenants/{tenant.pk}"
    [first_pid] = _host_pids(tenant)

    resp = client.post(f"{url}/suspend", {"reason": "invoice unpaid"}, format="json")
    assert resp.status_code == 202 and resp.json()["status"] == "suspended", resp.content
    wait_for(lambda: _host_pids(tenant) == [], timeout=60, what="suspended instance stopped by the worker")
    assert AgentInstance.objects.get(pk=instance.pk).status == "stopped"
    time.sleep(settings.HEARTBEAT_TIMEOUT_S + 1)
    assert recovery_sweep().dispatched == []
    assert client.post(f"{url}/restart", format="json").status_code == 409

    resp = client.post(f"{url}/resume", format="json")
    assert resp.status_code == 202 and resp.json()["status"] == "ready"
    wait_for(lambda: len(_host_pids(tenant)) == 1 and AgentInstance.objects.get(pk=instance.pk).status == "running",
             timeout=60, what="resumed instance started by the worker")
    [resumed_pid] = _host_pids(tenant)
    assert resumed_pid != first_pid

    assert client.post(f"{url}/restart", format="json").status_code == 202
    wait_for(lambda: _host_pids(tenant) not in ([], [resumed_pid]) and len(_host_pids(tenant)) == 1
             and AgentInstance.objects.get(pk=instance.pk).status == "running", timeout=60, what="restarted")
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 0
    stops = AuditLog.objects.filter(tenant=tenant, action="instance.stop").order_by("id")
    assert [a.data["reason"] for a in stops] == ["suspended", "restarting (by " + stops[1].actor_label + ")"]
    assert all(a.data["planned"] and a.actor_kind == "token" for a in stops)


def test_planned_stop_of_an_unsandboxed_host_started_by_another_process(operator, live_server, sinks,
                                                                         worker_factory, settings):
    """Without the sandbox the host is the onboarding worker's own child: once it exits it stays a zombie until
    that worker reaps it, and a stop from another process (this one, as the web or a command would) used to
    wait for the reaping until SIGKILL timed out. The exit is what counts."""
    from provisioning.fleet.actions import instance_stop_planned

    settings.LOCAL_INSTANCE_ISOLATION = "off"
    worker_factory(**WORKER_ENV, LOCAL_INSTANCE_ISOLATION="off", CONTROL_PLANE_INTERNAL_URL=live_server.url,
                   INSTANCE_EXTRA_ENV=f"AGENT_HEARTBEAT_INTERVAL_S=0.3,AGENT_SMTP_URL={sinks['smtp']}")
    try:
        tenant = onboard_ready(operator, "unsandboxed")
        [pid] = _host_pids(tenant)
        assert psutil.Process(pid).ppid() != os.getpid()  # someone else's child
        started = time.monotonic()
        instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="test")
        assert time.monotonic() - started < settings.RUNTIME_STOP_GRACE_S
        assert _host_pids(tenant) == [] and AgentInstance.objects.get(tenant=tenant).status == "stopped"
    finally:
        kill_session_instances()


def test_planned_restart_and_planned_stop_are_not_recoveries(operator, fleet, settings):
    """Issue 17 (honest history): the dashboard's restart and `make stop` / `make run` (local_instances) are
    recorded as what they are; sweeping long past the heartbeat timeout afterwards dispatches nothing."""
    from django.core.management import call_command

    from provisioning.fleet.actions import instance_restart

    tenant = onboard_ready(operator, "planned")
    instance = AgentInstance.objects.get(tenant=tenant)
    wait_for(lambda: AgentInstance.objects.get(pk=instance.pk).last_heartbeat_at or
             heartbeat_store().get(str(instance.pk)), timeout=30, what="first heartbeat")
    old_pid = _host_pids(tenant)[0]
    instance_restart(tenant=tenant, actor=SYSTEM)
    assert _host_pids(tenant) and _host_pids(tenant)[0] != old_pid
    call_command("local_instances", "stop")
    assert _host_pids(tenant) == []
    assert AgentInstance.objects.get(pk=instance.pk).status == "stopped"
    time.sleep(settings.HEARTBEAT_TIMEOUT_S + 1)  # long silent: a stopped instance is not dead
    assert recovery_sweep().dispatched == []
    call_command("local_instances", "start")
    assert AgentInstance.objects.get(pk=instance.pk).status == "running" and len(_host_pids(tenant)) == 1
    for _ in range(5):  # while its first heartbeats arrive, and after
        assert recovery_sweep().dispatched == []
        time.sleep(0.5)
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()
    actions = list(AuditLog.objects.filter(tenant=tenant, action__startswith="instance.").values_list("action",
                                                                                                     flat=True))
    assert {"instance.restart", "instance.stop", "instance.start"} <= set(actions), actions
