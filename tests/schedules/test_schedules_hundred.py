"""Issue 35, schedules at scale under kills: 100 schedules of one customer (second-granularity cron, staggered so
that five are due every second), fired by a real beat and two real Celery workers into a real agent-host that
starts asleep (scale to zero) and is put to sleep again during an outage. The workers and beat are SIGKILLed and
restarted, each several times, one at a time and together.

Every fire time from each schedule's first to its last fired, reached the agent exactly once (each fire's inbox
item is one task at the instance, whose step finished once; no other task is there) and was delivered within the
documented bound: ``ON_TIME_BOUND_S`` after its time while beat and a worker run, ``RECOVERY_BOUND_S`` after they
are both back when it fell in an outage (docs/schedules.md, "How late").
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from psycopg import sql

from controlplane.periodic import periodic_jobs_sync
from conversations.models import InboxItem
from instances.client import forget_tenant
from provisioning.choices import InstanceStatus
from provisioning.drivers.pg_admin import admin_connect
from provisioning.fleet.sleep import instance_sleep
from provisioning.models import AgentInstance, InstanceWake
from provisioning.workflows.onboarding import tenant_onboard
from schedules.models import ScheduleFire
from schedules.services import schedule_create, schedule_update
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import kill_session_instances, wait_for
from tests.schedules.test_schedules_chaos import Beat

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULES = 100
# Each schedule every PERIOD_S seconds, staggered so that five of them are due every second: the customer's
# schedules fire every second. (Every 2 s each, 50 fire times a second, is more than the workers of this shared 2-core
# machine deliver to one instance; a backlog would grow without bound, and so would the lateness.)
PERIOD_S = 20
# What a fire may take from its time to the instance (docs/schedules.md, "How late"): while beat and a worker run,
# the sweep interval (1 s here), the dispatch of everything due with it and, the instance asleep, its wake; after an
# outage, from the moment beat and a worker are both started again: their start-up, the catch-up of the missed times
# and the wake. Set for a loaded 2-core machine (CI beside other work): idle, the figures printed are a few seconds.
ON_TIME_BOUND_S = 30.0
RECOVERY_BOUND_S = 45.0
SWEEP_TASK = "schedules.tasks.schedules_sweep_task"
JOBS = {SWEEP_TASK, "provisioning.tasks.instance_sleep_sweep_task",
        "conversations.tasks.inbox_deliver_pending"}
EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS"}


def _instance(tenant: Tenant) -> AgentInstance:
    return AgentInstance.objects.get(tenant=tenant)


def _put_to_sleep(tenant: Tenant) -> None:
    """Asleep as soon as it may be: never with an item waiting in the inbox or a task unfinished (asked again until
    the worker has delivered the one and the instance has run the other)."""
    said: list[str] = []

    def asleep() -> bool:
        said.append(instance_sleep(instance=_instance(tenant), idle_s=0))
        return said[-1] == "asleep"

    try:
        wait_for(asleep, timeout=60, interval=0.1, what="the instance asleep")
    except AssertionError:
        unfinished = {t: state for t, state in _instance_tasks(tenant).items() if state[0] != "done"}
        logs = sorted(Path(settings.LOCAL_VOLUME_ROOT).glob(f"*{tenant.resource_name}*/.host/agent-host.log"))
        tail = "\n".join(logs[-1].read_text().splitlines()[-10:]) if logs else "(no log)"
        raise AssertionError(f"never asleep; the last answers: {said[-3:]}; unfinished tasks {unfinished}; "
                             f"host log:\n{tail}") from None


def _instance_tasks(tenant: Tenant) -> dict[str, tuple[str, int]]:
    """Task id -> (status, finished steps), read from the tenant's own schema: the agent's side of each fire."""
    with admin_connect(autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT t.id::text, t.status, (SELECT count(*) FROM {s}.step_events e WHERE e.task_id = t.id"
            " AND e.event = 'done') FROM {s}.tasks t").format(s=sql.Identifier(tenant.resource_name))).fetchall()
    return {r[0]: (r[1], int(r[2])) for r in rows}


def _cron_times(start: datetime, end: datetime, offset: int) -> list[datetime]:
    t = start.replace(microsecond=0) + timedelta(seconds=1)
    out = []
    while t <= end:
        if t.second % PERIOD_S == offset:
            out.append(t)
        t += timedelta(seconds=1)
    return out


def test_a_hundred_schedules_fire_each_time_once_through_kills_and_sleep(
        operator, settings, worker_factory):
    settings.SCHEDULES_SWEEP_INTERVAL_S = 1.0
    settings.INSTANCE_EXTRA_ENV = dict(EXTRA_ENV)
    periodic_jobs_sync()
    PeriodicTask.objects.exclude(task__in=JOBS).update(enabled=False)  # no recovery of a host on purpose asleep
    worker_env = {"INSTANCE_EXTRA_ENV": ",".join(f"{k}={v}" for k, v in EXTRA_ENV.items()),
                  "LOCAL_EXIT_NOTICE": "true", "RUNTIME_STOP_GRACE_S": "10"}
    # Two workers, as a deployment has more than one: a wake (a boot) does not wait behind the sweeps. "The worker"
    # going down below is both of them: every worker.
    workers = [worker_factory(**worker_env) for _ in range(2)]
    beats: list[Beat] = []
    try:
        tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="hundred", name="Hundred",
                                   actor=SYSTEM)
        wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
        tenant.refresh_from_db()
        assert tenant.status == "ready", workers[0].log()[-2000:] + workers[1].log()[-2000:]
        forget_tenant(str(tenant.pk))
        _put_to_sleep(tenant)  # the first fire wakes it

        # Beat ticking first (its start-up takes seconds): the schedules then start firing at once.
        beats.append(Beat())
        wait_for(lambda: any(f"{SWEEP_TASK}[" in w.log() for w in workers), timeout=60, what="beat sending the sweep")
        made_at = timezone.now()
        schedules = [schedule_create(tenant=tenant, name=f"every-{PERIOD_S}s-{i:03d}",
                                     cron=f"* * * * * {i % PERIOD_S}-59/{PERIOD_S}", timezone_name="UTC", at=None,
                                     task={"kind": "tick", "params": {"schedule": i}}, message=None, catch_up="all",
                                     catch_up_max=100, actor=SYSTEM, now=made_at)
                     for i in range(SCHEDULES)]
        # Outages: (what went down, when, when it was started again).
        outages: list[tuple[str, datetime, datetime]] = []

        def awake(what: str) -> None:
            try:
                wait_for(lambda: _instance(tenant).status == InstanceStatus.RUNNING, timeout=60, what=what)
            except AssertionError:
                inst = _instance(tenant)
                wakes = list(InstanceWake.objects.filter(tenant=tenant).values_list("outcome", "trigger", "error"))
                raise AssertionError(f"not {what}: {inst.status} ({inst.status_reason}), wakes {wakes}; workers:\n"
                                     + "\n".join(w.log()[-3000:] for w in workers)) from None

        def outage(what: str, down_s: float, *, asleep: bool = False) -> None:
            nonlocal workers
            down = timezone.now()
            if what in ("beat", "both"):
                beats[-1].kill()
            while asleep:  # beat is down: the worker delivers what is due, the instance runs it, and it sleeps
                _put_to_sleep(tenant)
                time.sleep(1.5)  # a sweep beat queued before it died may still wake it: then again, once awake
                if not InstanceWake.objects.filter(tenant=tenant, outcome="pending").exists():
                    break
                awake("woken by a sweep beat had queued")
            if what in ("worker", "both"):
                for w in workers:
                    w.kill()
            time.sleep(down_s)
            up = timezone.now()
            if what in ("worker", "both"):
                workers = [worker_factory(**worker_env) for _ in range(2)]
            if what in ("beat", "both"):
                beats.append(Beat())
            outages.append((what, down, up))

        awake("woken by a fire")
        time.sleep(3)
        outage("worker", 2)
        time.sleep(4)
        outage("beat", 2)
        time.sleep(4)
        outage("both", 2, asleep=True)
        awake("woken again")
        time.sleep(3)
        outage("worker", 2)
        time.sleep(3)
        outage("beat", 2)
        # A quiet tail longer than the recovery bound's reach past the on-time one (45 - 30 s): fires due in its
        # last seconds are held to their own 30 s, so the on-time bound is checked too.
        time.sleep(RECOVERY_BOUND_S - ON_TIME_BOUND_S + 6)

        # No new fire times from here (pausing is not downtime); what is due is dispatched, and delivered.
        paused_at: dict[int, datetime] = {}
        for i, schedule in enumerate(schedules):
            paused_at[i] = timezone.now()
            schedule_update(schedule=schedule, changes={"paused": True}, actor=SYSTEM, now=paused_at[i])
        wait_for(lambda: not ScheduleFire.objects.filter(tenant=tenant, status="pending").exists(), timeout=60,
                 what="every fire dispatched")
        wait_for(lambda: not InboxItem.objects.filter(tenant=tenant, status="pending").exists(), timeout=60,
                 what="every fire delivered")
        fires = list(ScheduleFire.objects.filter(tenant=tenant).select_related("inbox_item"))
        wait_for(lambda: Counter(s for s, _ in _instance_tasks(tenant).values()) == {"done": len(fires)},
                 timeout=60, what="every task done at the instance")
    finally:
        for beat in beats:
            beat.kill()
        kill_session_instances()

    # Every fire time, per schedule, from the first to the last: none missing, none twice (a unique row each).
    by_schedule: dict[int, list[datetime]] = {}
    for fire in fires:
        by_schedule.setdefault(int(fire.target["params"]["schedule"]), []).append(fire.fire_time)
    assert sorted(by_schedule) == list(range(SCHEDULES))
    for i, times in by_schedule.items():
        times.sort()
        expected = _cron_times(made_at, times[-1], i % PERIOD_S)
        assert times == expected, f"schedule {i}: {len(times)} fire times, expected {len(expected)}"
        # Fired until it was paused (give or take what the sweep had not reached yet).
        assert times[-1] >= paused_at[i] - timedelta(seconds=PERIOD_S + ON_TIME_BOUND_S)
    assert {f.status for f in fires} == {"dispatched"}
    assert len(fires) >= SCHEDULES * 30 // PERIOD_S  # half a minute of fire times at least

    # Exactly once at the agent's side: one inbox item per fire key, one task per item, its step done once.
    per_key = Counter(InboxItem.objects.filter(tenant=tenant).values_list("idempotency_key", flat=True))
    assert set(per_key.values()) == {1} and set(per_key) == {f.idempotency_key for f in fires}
    assert all(f.inbox_item is not None and f.inbox_item.idempotency_key == f.idempotency_key for f in fires)
    at_instance = _instance_tasks(tenant)
    assert set(at_instance) == {str(f.inbox_item_id) for f in fires}
    assert set(at_instance.values()) == {("done", 1)}

    # How late: measured to the delivery (the instance has the task). Each fire's deadline is its time plus the
    # on-time bound or, when an outage began before that deadline (the fire was due, or on its way, when it went
    # down), the recovery bound after the outage's restart, whichever is later: a fire due just after the restart waits
    # behind the catch-up of the missed ones (docs/schedules.md, "How late").
    late_on_time, late_after_outage, overdue = [], [], []
    for fire in fires:
        item = fire.inbox_item
        assert item is not None and item.delivered_at is not None
        lateness = (item.delivered_at - fire.fire_time).total_seconds()
        deadline = fire.fire_time + timedelta(seconds=ON_TIME_BOUND_S)
        ups = [up for _what, down, up in outages if down <= deadline]
        if ups and max(ups) + timedelta(seconds=RECOVERY_BOUND_S) > deadline:
            deadline = max(ups) + timedelta(seconds=RECOVERY_BOUND_S)
            late_after_outage.append((item.delivered_at - max(ups)).total_seconds())
        else:
            late_on_time.append(lateness)
        if item.delivered_at > deadline:
            overdue.append((fire.fire_time.isoformat(), round(lateness, 2)))
    dispatch = sorted((f.dispatched_at - f.fire_time).total_seconds() for f in fires if f.dispatched_at)
    summary = {"fires": len(fires), "dispatch_p50_s": round(dispatch[len(dispatch) // 2], 2),
               "dispatch_max_s": round(dispatch[-1], 2), "outages": len(outages),
               # Fires whose deadline was their own 30 s, and those whose deadline an outage's restart set.
               "on_time": len(late_on_time), "on_time_max_s": round(max(late_on_time, default=0.0), 2),
               "after_outage": len(late_after_outage),
               "after_outage_max_s": round(max(late_after_outage, default=0.0), 2)}
    print("schedules-hundred", json.dumps(summary))
    assert late_on_time, summary  # the quiet tail's fires
    assert not overdue, (summary, overdue[:10], [(w, d.isoformat(), u.isoformat()) for w, d, u in outages])
