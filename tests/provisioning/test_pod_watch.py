"""The Kubernetes profile notices a dead instance from its pod's events (provisioning/recovery/pod_watch.py).

Real PostgreSQL, kmock's Kubernetes emulator with ``ClusterEmulator``'s pod watch streams (resourceVersions,
410 Gone, cut connections) and moto's S3/STS, reached by the real ``kubernetes`` client's ``Watch``. The fake
kubelet plays the StatefulSet controller (``pods=True``): it keeps each tenant's pod and reports it ready
``boot_s`` after creating it; the tests change pods through the API as a kubelet, an eviction or a user would.
No agent runs in the emulator, so a started recovery is checked by its ``RecoveryEvent`` (not run to its end).
Scale to zero on Kubernetes (the StatefulSet at zero replicas, then woken) is here too: asleep is not dead.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioning.choices import RecoveryReason, WorkflowKind
from provisioning.models import AgentInstance, RecoveryEvent, WorkflowRun
from provisioning.recovery.pod_watch import PodWatcher
from provisioning.workflows.onboarding import tenant_deprovision, tenant_onboard
from tenants.actors import SYSTEM
from tenants.choices import TenantStatus
from tenants.models import Tenant
from tests.conftest import BASE_DIR, RUN_ID, subprocess_env
from tests.k8s_fixtures import moto_server, run_cluster, wait_until
from tests.provisioning.test_k8s_e2e import run_to_end

pytestmark = pytest.mark.django_db(transaction=True)

MERGE = "application/merge-patch+json"


@pytest.fixture
def production(tmp_path, settings, monkeypatch):  # type: ignore[no-untyped-def]
    """The kubernetes profile against the emulator (pods kept by the fake kubelet) and moto's S3/STS."""
    with moto_server() as moto_url:
        cluster_run = run_cluster(tmp_path, settings, pods=True, boot_s=0.1)
        cluster = next(cluster_run)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "cp-test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cp-test-secret")
        settings.PROVISIONING_PROFILE = "kubernetes"
        settings.PROVISIONING_RUNTIME_DRIVER = ""
        settings.S3_BUCKET = f"tenants-{RUN_ID}"
        settings.S3_ENDPOINT_URL = settings.S3_STS_ENDPOINT_URL = moto_url
        settings.S3_REGION = "us-east-1"
        settings.S3_CREATE_BUCKET = True
        settings.S3_ACCESS_KEY_ID = "cp-test"
        settings.S3_SECRET_ACCESS_KEY = "cp-test-secret"
        settings.S3_ROLE_ARN = "arn:aws:iam::123456789012:role/agent-tenant-objects"
        yield cluster
        next(cluster_run, None)


def onboard(operator, slug: str) -> tuple[Tenant, str]:  # type: ignore[no-untyped-def]
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug, actor=SYSTEM)
    run_to_end(tenant, WorkflowKind.ONBOARD)
    tenant.refresh_from_db()
    assert tenant.status == TenantStatus.READY
    assert AgentInstance.objects.get(tenant=tenant).status == "running"
    return tenant, "tenant-" + tenant.resource_name.replace("_", "-")


class Running:
    """A ``PodWatcher`` in a thread of the test process (its own database connection)."""

    def __init__(self, **kwargs: Any) -> None:
        from django.db import connections

        self.messages: list[str] = []
        kwargs.setdefault("timeout_s", 5)
        kwargs.setdefault("restart_grace_s", 1.0)
        kwargs.setdefault("backoff_s", 0.05)
        resource_version = kwargs.pop("resource_version", None)
        self.watcher = PodWatcher(progress=self.messages.append, **kwargs)
        self.watcher.resource_version = resource_version  # None: list first; else resume from there

        def run() -> None:
            try:
                self.watcher.run()
            finally:
                connections.close_all()

        self.thread = threading.Thread(target=run, daemon=True, name="pod-watch")
        self.thread.start()
        wait_until(lambda: any(m.startswith("watching") for m in self.messages), what="the watch to start")

    def outcomes(self, tenant: Tenant) -> list[tuple[str, str]]:
        return [(why, result) for tid, why, result in list(self.watcher.outcomes) if tid == str(tenant.pk)]

    def stop(self) -> None:
        self.watcher.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def watchers():  # type: ignore[no-untyped-def]
    started: list[Running] = []

    def start(**kwargs: Any) -> Running:
        started.append(Running(**kwargs))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def pod_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/agent-host-0"


def ready_pod(cluster, ns: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    def ready() -> dict[str, Any] | None:
        pod = cluster.http("GET", pod_path(ns))
        if pod and (pod.get("status") or {}).get("phase") == "Running":
            return pod
        return None

    return wait_until(ready, what=f"pod {ns}/agent-host-0 running")


def container_status(state: dict[str, Any], *, restarts: int, ready: bool) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "agent-host", "image": "x", "imageID": "", "ready": ready,
                                              "restartCount": restarts, "state": state}]}}


def recovery_of(tenant: Tenant, timeout: float = 5.0) -> RecoveryEvent:
    return wait_until(lambda: RecoveryEvent.objects.filter(tenant=tenant).first(), timeout=timeout,
                      what="a recovery to start")


def test_a_deleted_pod_starts_the_dead_recovery_within_a_second(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-deleted")
    ready_pod(cluster, ns)
    running = watchers()
    cluster.kubelet.boot_s = 30.0  # its replacement is created at once but takes its time to be ready
    started = time.monotonic()
    from django.utils import timezone

    deleted_at = timezone.now()
    cluster.http("DELETE", pod_path(ns))
    event = recovery_of(tenant)
    noticed_s = time.monotonic() - started
    assert event.reason == RecoveryReason.DEAD
    assert "its pod was deleted; noticed from pod events" in event.detail, event.detail
    detected_s = (event.detected_at - deleted_at).total_seconds()
    print(f"\npod watch: recovery started {detected_s:.3f} s after the pod's deletion (seen by the test after "
          f"{noticed_s:.2f} s)")
    assert detected_s < 2.0
    instance = AgentInstance.objects.get(tenant=tenant)
    assert instance.status == "recovering"
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1
    assert WorkflowRun.objects.filter(tenant=tenant, kind=WorkflowKind.RECOVER).count() == 1
    # The replacement pod's events (ADDED, later ready) change nothing: one recovery.
    wait_until(lambda: any(r == "recovery started" for _w, r in running.outcomes(tenant)), what="the outcome")


def test_an_evicted_pod_starts_the_dead_recovery(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-evicted")
    ready_pod(cluster, ns)
    watchers()
    cluster.http("PATCH", f"{pod_path(ns)}/status", {"status": {"phase": "Failed", "reason": "Evicted"}},
                 content_type=MERGE)
    event = recovery_of(tenant)
    assert event.detail.startswith("its pod failed; noticed from pod events"), event.detail


def test_planned_stops_restarts_and_deprovisioning_start_no_recovery(production, operator, watchers):
    from provisioning.fleet.actions import instance_restart, instance_stop_planned

    cluster = production
    cluster.kubelet.boot_s = 0.5  # a replacement pod is ready half a second after it was created
    tenant, ns = onboard(operator, "pw-planned")
    first = ready_pod(cluster, ns)
    before_restart = str(cluster.http("GET", "/api/v1/pods")["metadata"]["resourceVersion"])
    running = watchers()

    instance_restart(tenant=tenant, actor=SYSTEM)  # marks it stopped, deletes the pod, waits for the new one
    second = ready_pod(cluster, ns)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    wait_until(lambda: running.outcomes(tenant), what="the deletion's event handled")
    assert running.outcomes(tenant)[0] == ("its pod was deleted", "not meant to run (stopped, tenant ready)")

    # A watcher lagging behind: it reads the restart's DELETED only now, when the instance runs again (on
    # its replacement pod): the instance is back, nothing is started.
    lagging = watchers(resource_version=before_restart)
    wait_until(lambda: lagging.outcomes(tenant), what="the lagging watcher's outcome")
    assert lagging.outcomes(tenant)[0] == ("its pod was deleted", "back already (left to the kubelet)")
    lagging.stop()

    instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="maintenance")
    wait_until(lambda: len(running.outcomes(tenant)) >= 2, what="the planned stop's event handled")
    assert running.outcomes(tenant)[1][1].startswith("not meant to run (stopped")
    AgentInstance.objects.filter(tenant=tenant).update(status="running")
    ready_pod(cluster, ns)

    # A rolling restart: each instance is marked stopped and its pod deleted, then started again once the
    # runtime recorded its clean shutdown. The emulator runs no agent (no host_events table in the tenant's
    # schema), so the rollout stops at that read; what matters here: the deletion started no recovery.
    from provisioning.fleet.rolling import rolling_restart_execute, rolling_restart_start
    from provisioning.models import RollingRestartItem

    seen = len(running.outcomes(tenant))
    rollout = rolling_restart_start(actor=SYSTEM)
    rolling_restart_execute(rollout.pk)
    item = RollingRestartItem.objects.get(rollout=rollout, instance__tenant=tenant)
    assert "host_events" in item.error  # the only part the emulator cannot play
    wait_until(lambda: len(running.outcomes(tenant)) > seen, what="the rolling restart's deletion handled")
    assert running.outcomes(tenant)[seen][1].startswith("not meant to run (stopped")

    tenant_deprovision(tenant=tenant, actor=SYSTEM)
    run_to_end(tenant, WorkflowKind.DEPROVISION)
    wait_until(lambda: cluster.http("GET", pod_path(ns)) is None, what="the pod gone with its namespace")
    time.sleep(0.5)  # the watcher's turn
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists(), running.outcomes(tenant)
    assert all(r != "recovery started" for _w, r in running.outcomes(tenant))


def test_the_kubelet_restarting_the_container_in_place_is_left_alone(production, operator, watchers):
    """A container that terminated (OOMKilled) and runs again with restartCount + 1 within the grace: the
    kubelet did the restart, a recovery would only stop the fresh container again. One that stays down past
    the grace gets the dead recovery."""
    cluster = production
    tenant, ns = onboard(operator, "pw-kubelet")
    ready_pod(cluster, ns)
    running = watchers(restart_grace_s=1.0)
    status = f"{pod_path(ns)}/status"
    cluster.http("PATCH", status, container_status(
        {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, restarts=0, ready=False), content_type=MERGE)
    time.sleep(0.3)
    cluster.http("PATCH", status, container_status({"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                                                   restarts=1, ready=True), content_type=MERGE)
    time.sleep(1.5)  # past the grace
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists(), running.outcomes(tenant)
    assert ("restarted by the kubelet (restart 1)", "left to the kubelet") in running.outcomes(tenant)

    cluster.http("PATCH", status, container_status(
        {"terminated": {"exitCode": 1, "reason": "Error"}}, restarts=1, ready=False), content_type=MERGE)
    event = recovery_of(tenant, timeout=5)
    assert "its agent container terminated (exit code 1, Error), and the kubelet did not restart it within 1 s" \
        in event.detail, event.detail


def test_a_crash_looping_container_starts_the_recovery_at_once(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-crashloop")
    ready_pod(cluster, ns)
    watchers(restart_grace_s=60)
    cluster.http("PATCH", f"{pod_path(ns)}/status", container_status(
        {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3, ready=False), content_type=MERGE)
    assert "crash-looping (3 restarts)" in recovery_of(tenant, timeout=3).detail


def test_a_cut_stream_and_410_gone_are_survived(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-resume")
    ready_pod(cluster, ns)
    running = watchers(backoff_s=1.0)  # it waits about a second before reconnecting: the test acts meanwhile
    assert running.watcher.relists == 1

    # "watching" is said before the request reaches the server: drop only a watch the server holds.
    wait_until(lambda: cluster.pod_watch_count() >= 1, what="the watch held by the server")
    cluster.drop_pod_watches()  # a broken connection: it resumes from its last resourceVersion
    wait_until(lambda: sum(m.startswith("watching") for m in running.messages) >= 2, what="the resumed watch")
    assert any(m.startswith("watch interrupted (ProtocolError") for m in running.messages), running.messages
    assert running.watcher.relists == 1  # resumed, not relisted

    # Cut again; while it is away the pod is deleted (and replaced) and the history compacted: resuming
    # answers 410 Gone, it lists again and finds another pod under the name, so the old one died unseen.
    cluster.kubelet.boot_s = 30.0
    # The server holds its reconnection until the deletion and the compaction below have both happened: back
    # early, it would read the deletion from the stream and never meet the 410 (a longer backoff raced that
    # and lost twice under load in CI).
    wait_until(lambda: cluster.pod_watch_count() >= 1, what="the resumed watch held by the server")
    cluster.hold_pod_watches()
    cluster.drop_pod_watches()
    wait_until(lambda: sum(m.startswith("watch interrupted") for m in running.messages) >= 2, what="the cut")
    cluster.http("DELETE", pod_path(ns))
    wait_until(lambda: (cluster.http("GET", pod_path(ns)) or {}).get("status", {}).get("phase") == "Pending",
               what="the replacement pod")
    cluster.compact_pod_history()
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 0  # still away: nothing seen yet
    wait_until(lambda: cluster.pod_watches_waiting() >= 1, timeout=15, what="its reconnection, held at the server")
    cluster.release_pod_watches()
    event = recovery_of(tenant, timeout=20)
    assert "its pod was deleted; noticed from pod events" in event.detail
    assert running.watcher.relists == 2
    assert any("(410 Gone): listing again" in m for m in running.messages), running.messages
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1


def test_two_watchers_start_one_recovery(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-twice")
    ready_pod(cluster, ns)
    one, two = watchers(), watchers()
    cluster.kubelet.boot_s = 30.0
    cluster.http("DELETE", pod_path(ns))
    wait_until(lambda: one.outcomes(tenant) and two.outcomes(tenant), what="both watchers' outcomes")
    results = sorted(r for w in (one, two) for _why, r in w.outcomes(tenant)[:1])
    assert results[1] == "recovery started", results
    assert results[0] in ("a recovery is already under way", "not meant to run (recovering, tenant recovering)")
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1


def _sts(cluster, ns: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return cluster.http("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/agent-host")


def test_an_idle_instance_sleeps_at_zero_replicas_the_watcher_leaves_it_and_a_wake_brings_its_pod_back(
        production, operator, watchers, settings):
    """Scale to zero on Kubernetes: the sleep job scales the StatefulSet to 0 (its pod goes, none replaces it);
    neither the pod watcher nor the sweep takes that for a death; a wake applies replicas 1 and is ready on a
    new pod. The emulator runs no agent, so the runtime's tables are migrated into the schema by hand (the
    sleeper reads them to decide the instance is idle)."""
    from datetime import timedelta

    from django.utils import timezone

    from agent_runtime.state import migrations as runtime_migrations
    from provisioning.choices import InstanceStatus, WakeOutcome
    from provisioning.drivers.pg_admin import tenant_admin_connect
    from provisioning.fleet.sleep import instance_wake, sleep_sweep
    from provisioning.models import InstanceWake
    from provisioning.recovery.sweep import recovery_sweep

    cluster = production
    tenant, ns = onboard(operator, "pw-sleep")
    first = ready_pod(cluster, ns)
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        runtime_migrations.migrate(conn, tenant.resource_name)
    running = watchers()
    settings.INSTANCE_IDLE_SUSPEND_S = 60
    instance = AgentInstance.objects.get(tenant=tenant)

    result = sleep_sweep(now=timezone.now() + timedelta(minutes=5))  # as if five quiet minutes had passed
    assert result.asleep == [str(instance.pk)]
    assert _sts(cluster, ns)["spec"]["replicas"] == 0
    assert cluster.http("GET", pod_path(ns)) is None  # gone, and the controller made none
    time.sleep(0.3)  # the fake controller's rounds: still none
    assert cluster.http("GET", pod_path(ns)) is None
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.ASLEEP and instance.asleep_at is not None
    wait_until(lambda: running.outcomes(tenant), what="the deletion's event handled")
    assert running.outcomes(tenant)[0] == ("its pod was deleted", "not meant to run (asleep, tenant ready)")
    recovery_sweep()
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()

    wake = InstanceWake.objects.create(tenant=tenant, instance=instance, trigger="test", requested_at=timezone.now())
    assert instance_wake(wake_id=wake.pk) == WakeOutcome.SUCCEEDED
    assert _sts(cluster, ns)["spec"]["replicas"] == 1
    second = ready_pod(cluster, ns)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.RUNNING and instance.asleep_at is None
    wake.refresh_from_db()
    assert wake.outcome == WakeOutcome.SUCCEEDED and wake.boot_s is not None
    print(f"\nk8s scale to zero: woken, ready on a new pod {wake.boot_s:.2f} s after the wake was asked for")
    time.sleep(0.5)  # the watcher's turn on the new pod's events
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists(), running.outcomes(tenant)


def test_the_watcher_uses_exactly_what_its_rbac_grants(production, operator, watchers):
    cluster = production
    tenant, ns = onboard(operator, "pw-rbac")
    ready_pod(cluster, ns)
    start = len(cluster.emulator.client_queries)
    watchers()
    cluster.kubelet.boot_s = 30.0
    cluster.http("DELETE", pod_path(ns))
    recovery_of(tenant)
    used = set()
    for method, path, query in cluster.emulator.client_queries[start:]:
        if not path.endswith("/pods") and "/pods/" not in path:
            continue
        assert method == "GET", (method, path)
        if "/pods/" in path:
            used.add("get")
            continue
        assert "labelSelector=" in query, query  # only agent pods, never every pod of the cluster
        used.add("watch" if "watch=true" in query.lower() else "list")
    assert used == {"list", "watch", "get"}
    docs = list(yaml.safe_load_all((BASE_DIR / "deploy/kubernetes/10-rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("instance-watcher"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": sorted(used)}]


def test_manage_py_watch_instances_notices_and_stops_cleanly_on_sigterm(production, operator, settings):
    cluster = production
    tenant, ns = onboard(operator, "pw-command")
    ready_pod(cluster, ns)
    log_path = Path(settings.KUBERNETES_KUBECONFIG).with_name("watch.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "watch_instances", "--restart-grace-s", "1", "--timeout-s", "5"],
            cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
            env=subprocess_env(PROVISIONING_PROFILE="kubernetes", KUBERNETES_KUBECONFIG=settings.KUBERNETES_KUBECONFIG,
                               KUBERNETES_IN_CLUSTER="false"))
        try:
            wait_until(lambda: "watching agent pods from" in log_path.read_text(), timeout=30,
                       what="the command to watch")
            cluster.kubelet.boot_s = 30.0
            from django.utils import timezone

            deleted_at = timezone.now()
            cluster.http("DELETE", pod_path(ns))
            event = recovery_of(tenant, timeout=10)
            print(f"\nmanage.py watch_instances: recovery started "
                  f"{(event.detected_at - deleted_at).total_seconds():.3f} s after the pod's deletion")
            assert (event.detected_at - deleted_at).total_seconds() < 2.0
            wait_until(lambda: "recovery started" in log_path.read_text(), what="the command's report")
        finally:
            terminated = time.monotonic()
            proc.terminate()
            code = proc.wait(timeout=15)
            stop_s = time.monotonic() - terminated
    out = log_path.read_text()
    assert code == 0, out
    print(f"manage.py watch_instances: exited {stop_s:.2f} s after SIGTERM")
    assert stop_s < 5.0
    assert "SIGTERM: stopping" in out and "stopped at resourceVersion" in out, out
    assert f"tenant {tenant.pk}: its pod was deleted" in out
