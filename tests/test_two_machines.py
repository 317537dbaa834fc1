"""Issue 40: the control plane on two "machines" of this one, nothing shared but PostgreSQL, Redis and the object
store (moto's S3 server over HTTP).

Each machine is a gunicorn web, Celery workers and a beat (``LeaderScheduler``), with its own
``CONTROLPLANE_VAR_DIR``. Instances are real ``agent-host`` processes; their control-plane URL is machine 2's web
(the load balancer's, in production). Then:

1. A release uploaded through machine 1's web (validated there, its wheel in the store) is rolled out by machine
   2's worker (machine 1 runs no worker yet): every instance boots on it once, from machine 2's own cache.
2. Machine 2's worker frozen (SIGSTOP), a second release's rollout and the onboarding of ``TWO_MACHINES_TENANTS``
   customers (the issue's 20 by default; fewer with ``TWO_MACHINES_TENANTS``) start on machine 1's two workers, with a
   schedule firing every second and machine 1's beat leading. Every process of machine 1
   SIGKILLed mid-rollout and mid-onboarding, machine 2's worker let go: machine 2's beat takes the lease within
   its period, its resume-stalled sweep hands the stalled work to machine 2's worker, and everything finishes:
   no instance boots twice on the new release, no completed onboarding step runs again, no fire twice.
3. Machine 2's whole var/ wiped while it runs: an instance restarted from there installs its release again from
   the store, and the schedule keeps firing.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import time
from collections import Counter

import pytest
import requests
from django.utils import timezone

from provisioning.models import ProvisionedResource, WorkflowRun, WorkflowStep
from releases.models import AgentRelease, Rollout, RolloutItem
from schedules.models import ScheduleFire
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from tests.conftest import wait_for
from tests.conversation_helpers import stub_tenant
from tests.releases.test_release_instances import ENTRY_POINTS, GREETER
from tests.releases.test_release_rollouts import _boots_on
from tests.releases.test_releases_upload import make_wheel
from tests.schedules.test_schedules_sweep import assert_each_fire_once_at_the_instance, make

from .two_machines import LEASE_S, RENEW_S, Machine, beat_leader, machines, only_the_sweeps  # noqa: F401 (machines)

TENANTS = int(os.environ.get("TWO_MACHINES_TENANTS", "20"))
# About 3 minutes for 8 on a 2-core host shared with other test runs (load 11), 6 for 20; real instances boot slowly.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300 + 30 * TENANTS)]
ROLLED = 3  # tenants whose instances the rollouts restart


def _upload(machine: Machine, headers: dict[str, str], version: str) -> AgentRelease:
    filename, data = make_wheel("greeter-agent", version, module=GREETER.format(version=version),
                                entry_points=ENTRY_POINTS)
    answer = requests.post(f"{machine.url}/api/v1/releases", headers=headers, files={"file": (filename, data)},
                           timeout=120)
    assert answer.status_code == 201, answer.text
    release = AgentRelease.objects.get(pk=answer.json()["id"])
    assert release.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    return release


def _rollout(machine: Machine, headers: dict[str, str], release: AgentRelease, **plan: int) -> Rollout:
    answer = requests.post(f"{machine.url}/api/v1/rollouts", headers=headers, json={"release": str(release.pk), **plan},
                           timeout=60)
    assert answer.status_code in (201, 202), answer.text
    return Rollout.objects.get(pk=answer.json()["id"])


def _onboard(machine: Machine, headers: dict[str, str], slug: str) -> Tenant:
    answer = requests.post(f"{machine.url}/api/v1/tenants", headers=headers,
                           json={"slug": slug, "name": slug, "allow_no_release": True}, timeout=60)
    assert answer.status_code in (201, 202), answer.text
    return Tenant.objects.get(pk=answer.json()["id"])


def _all_ready(tenants: list[Tenant]) -> bool:
    statuses = set(Tenant.objects.filter(pk__in=[t.pk for t in tenants]).values_list("status", flat=True))
    assert "failed" not in statuses
    return statuses == {"ready"}


def _finished(rollout: Rollout, timeout: float = 240) -> Rollout:
    wait_for(lambda: Rollout.objects.get(pk=rollout.pk).status not in ("running", "rolling_back", "paused"),
             timeout=timeout, what="the rollout finished")
    rollout.refresh_from_db()
    items = list(RolloutItem.objects.filter(rollout=rollout).values_list("status", "error"))
    assert rollout.status == "succeeded", (rollout.reason, items)
    return rollout


def test_machine_1_dies_mid_rollout_and_mid_onboarding_and_machine_2_finishes_everything(machines, operator):  # type: ignore[no-untyped-def]  # noqa: F811
    one, two, headers = machines
    only_the_sweeps()

    # Machine 2 up; machine 1's web and beat (its beat first: the leader we will kill).
    one.start_web()
    one.start_beat()
    wait_for(lambda: beat_leader() is not None and beat_leader()[0].split(":")[1] == str(one.beat.pid), timeout=60,
             what="machine 1's beat leading")
    two.start_web()
    two.start_beat()
    frozen = two.start_worker()

    # 1. Uploaded through machine 1's web, rolled out by machine 2's worker.
    rolled = [_onboard(one, headers, f"roll-{i}-{secrets.token_hex(2)}") for i in range(ROLLED)]
    wait_for(lambda: _all_ready(rolled), timeout=240, what="the first tenants ready")
    v2 = _upload(one, headers, "2.0.0")
    _finished(_rollout(one, headers, v2, canary=1, wave_size=2, soak_s=1))
    for tenant in rolled:
        assert _boots_on(tenant, v2.digest) == 1
    assert (two.var / "releases" / "envs" / v2.digest[7:] / "greeter_agent").is_dir()  # from the store

    # 2. A schedule every second; machine 2's worker frozen, machine 1's started: the work lands on machine 1.
    # The schedule's tenant is another operator's: its stub "instance" is in no rollout of this operator's.
    tenant, stub = stub_tenant(operator_create(slug=f"op-{secrets.token_hex(3)}", name="Schedules", actor=SYSTEM))
    try:
        schedule = make(tenant, cron="* * * * * *", catch_up="all", catch_up_max=100, now=timezone.now())
        wait_for(lambda: ScheduleFire.objects.filter(schedule=schedule, status="dispatched").count() >= 2,
                 timeout=60, what="the schedule firing")
        frozen.proc.send_signal(signal.SIGSTOP)
        one.start_worker()
        one.start_worker()
        v3 = _upload(one, headers, "3.0.0")
        rollout = _rollout(one, headers, v3, canary=1, wave_size=1, soak_s=8)
        # Half the customers now, the other half once the canary is upgraded: on a loaded machine the first half's
        # workflows can otherwise all finish before the rollout's first wave gets a worker, and machine 1 would
        # never be mid-both.
        onboarded = [_onboard(one, headers, f"new-{i}-{secrets.token_hex(2)}") for i in range(TENANTS // 2)]
        wait_for(lambda: RolloutItem.objects.filter(rollout=rollout, status="upgraded").exists(), timeout=240,
                 what="the canary upgraded")
        onboarded += [_onboard(one, headers, f"new-{i}-{secrets.token_hex(2)}") for i in range(TENANTS // 2, TENANTS)]

        def mid_everything() -> bool:
            """The canary upgraded (and soaking), the other waves not; not every customer onboarded yet."""
            items = Counter(RolloutItem.objects.filter(rollout=rollout).values_list("status", flat=True))
            ready = Tenant.objects.filter(pk__in=[t.pk for t in onboarded], status="ready").count()
            steps_done = WorkflowStep.objects.filter(run__tenant__in=onboarded, status="done").exists()
            return 0 < items["upgraded"] < ROLLED and ready < TENANTS and steps_done

        try:
            wait_for(mid_everything, timeout=240, interval=0.1, what="machine 1 mid-rollout and mid-onboarding")
        except AssertionError:
            items = list(RolloutItem.objects.filter(rollout=rollout).values_list("status", "error"))
            tenants = list(Tenant.objects.filter(pk__in=[t.pk for t in onboarded]).values_list("status", flat=True))
            rollout.refresh_from_db()
            raise AssertionError(f"never mid-everything: rollout {rollout.status} ({rollout.reason}), items {items}, "
                                 f"onboarded {tenants}") from None
        leader_before = beat_leader()
        assert leader_before is not None and leader_before[0].split(":")[1] == str(one.beat.pid)
        at_kill = {"items": Counter(RolloutItem.objects.filter(rollout=rollout).values_list("status", flat=True)),
                   "ready": Tenant.objects.filter(pk__in=[t.pk for t in onboarded], status="ready").count(),
                   "steps": WorkflowStep.objects.filter(run__tenant__in=onboarded, status="done").count()}
        one.kill()
        killed_at = time.monotonic()
        frozen.proc.send_signal(signal.SIGCONT)

        # Machine 2's beat leads within the lease period (and a renewal, and a busy machine's slack).
        wait_for(lambda: beat_leader()[0].split(":")[1] == str(two.beat.pid), timeout=30, interval=0.05,
                 what="machine 2's beat leading")
        takeover_s = time.monotonic() - killed_at
        leader_after = beat_leader()
        assert leader_after is not None and leader_after[1] > leader_before[1]
        assert takeover_s <= LEASE_S + RENEW_S + 4.0, takeover_s
        assert "lease beat: taken" in two.beat_log() or "beat: leading" in two.beat_log()

        _finished(rollout, timeout=300)
        wait_for(lambda: _all_ready(onboarded), timeout=300, what="every onboarding finished on machine 2")
        finished_at = time.monotonic()

        # No instance upgraded twice, none skipped; no onboarding step completed twice, each tenant ready once.
        for rolled_tenant in rolled:
            assert _boots_on(rolled_tenant, v3.digest) == 1, rolled_tenant.slug
        runs = list(WorkflowRun.objects.filter(tenant__in=onboarded, kind="onboard"))
        assert len(runs) == TENANTS and {r.status for r in runs} == {"succeeded"}, [(r.status, r.error) for r in runs]
        steps = list(WorkflowStep.objects.filter(run__in=runs).values_list("run_id", "name", "status", "attempts"))
        assert {status for _r, _n, status, _a in steps} == {"done"}, steps
        retried = Counter(run for run, _n, _s, attempts in steps if attempts > 1)
        assert all(n == 1 for n in retried.values()), retried  # at most the step in flight at the kill, per run
        for new in onboarded:
            readies = AuditLog.objects.filter(tenant=new, action=AuditAction.TENANT_TRANSITION,
                                              data__to="ready").count()
            assert readies == 1, new.slug
            assert ProvisionedResource.objects.filter(tenant=new, kind="runtime").count() == 1

        # 3. Machine 2's var/ wiped while it runs: a restart installs the release again from the store.
        shutil.rmtree(two.var)
        target = rolled[0]
        before = ProvisionedResource.objects.get(tenant=target, kind="runtime").details["pid"]
        answer = requests.post(f"{two.url}/api/v1/tenants/{target.pk}/restart", headers=headers, timeout=60)
        assert answer.status_code in (200, 202), answer.text

        def restarted() -> bool:
            details = ProvisionedResource.objects.get(tenant=target, kind="runtime").details
            return details.get("pid") != before and details.get("release_digest") == v3.digest

        wait_for(restarted, timeout=180, what="the instance restarted on its release after the wipe")
        assert (two.var / "releases" / "envs" / v3.digest[7:] / "greeter_agent").is_dir()
        fires_at_wipe = ScheduleFire.objects.filter(schedule=schedule).count()
        wait_for(lambda: ScheduleFire.objects.filter(schedule=schedule).count() >= fires_at_wipe + 3, timeout=60,
                 what="the schedule still firing after the wipe")

        # No fire lost or doubled across the kill and the wipe: one per second, each given to the instance once.
        for beat in (two.beat,):
            assert beat is not None
            beat.send_signal(signal.SIGSTOP)  # nothing more sent while we count
        time.sleep(2)
        times = list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_time")
                     .values_list("fire_time", flat=True))
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
        assert gaps == [1.0] * len(gaps), gaps
        wait_for(lambda: not ScheduleFire.objects.filter(schedule=schedule).exclude(status="dispatched").exists(),
                 timeout=30, what="every fire dispatched")
        fired = assert_each_fire_once_at_the_instance(stub, [schedule])
        print(f"\ntwo machines: {TENANTS} onboarding + {ROLLED}-tenant rollout, machine 1 killed with "
              f"{dict(at_kill['items'])}, {at_kill['ready']} ready, {at_kill['steps']} onboarding steps done; "
              f"beat lease taken over in {takeover_s:.2f} s "
              f"(lease {LEASE_S:g} s, renew {RENEW_S:g} s; epoch {leader_before[1]} -> {leader_after[1]}); "
              f"all finished {finished_at - killed_at:.1f} s after the kill; {fired} fires, each once; "
              f"{frozen.log().count('beat fencing: dropped')} old-epoch beat messages dropped by machine 2")
    finally:
        if two.beat is not None and two.beat.poll() is None:
            two.beat.send_signal(signal.SIGCONT)
        stub.stop()
