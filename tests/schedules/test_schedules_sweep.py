"""Issue 35, schedules: the sweep fires each fire time exactly once, and after an outage as the schedule's
catch-up policy says.

Time is never patched: the sweep and the services take ``now`` (a fixed clock for exact arithmetic), and the
real-time tests use second-granularity cron expressions. Exactly once is counted at the instance's side (the
protocol stub records every task it accepted) against real PostgreSQL: sweeps racing from threads and from
processes, and a real Celery worker SIGKILLed between creating the fire rows and dispatching them, and between
the inbox committing a fire's item and the fire being marked.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from conversations.models import InboxItem
from conversations.services import inbox_deliver
from schedules.models import Schedule, ScheduleFire
from schedules.services import schedule_create, schedule_update
from schedules.sweep import schedules_sweep
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog, Plan
from tests.conftest import BASE_DIR, subprocess_env, wait_for
from tests.conversation_helpers import stub_tenant

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)  # a schedule made then, the sweep next run a day later
TASK = {"kind": "demo", "params": {"report": "daily"}}


def make(tenant: Any, *, name: str = "s", cron: str | None = "0 * * * *", at: datetime | None = None,
         catch_up: str = "latest", catch_up_max: int = 10, now: datetime = T0, **target: Any) -> Schedule:
    return schedule_create(tenant=tenant, name=name, cron=cron, timezone_name="UTC", at=at,
                           task=target.get("task", TASK if "message" not in target else None),
                           message=target.get("message"), catch_up=catch_up, catch_up_max=catch_up_max,
                           actor=SYSTEM, now=now)


def fire_times(schedule: Schedule) -> list[datetime]:
    return list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_time").values_list("fire_time",
                                                                                                  flat=True))


def assert_each_fire_once_at_the_instance(stub: Any, schedules: list[Schedule]) -> int:
    """Every fire dispatched, its inbox item the one its key names, and the instance given each task once."""
    fires = list(ScheduleFire.objects.filter(schedule__in=schedules).select_related("inbox_item"))
    assert fires and {f.status for f in fires} == {"dispatched"}
    for fire in fires:
        assert fire.inbox_item is not None and fire.inbox_item.idempotency_key == fire.idempotency_key
    keys = [f.idempotency_key for f in fires]
    per_key = Counter(InboxItem.objects.filter(idempotency_key__in=keys).values_list("idempotency_key", flat=True))
    assert set(per_key.values()) == {1} and len(per_key) == len(fires)
    accepted = Counter(tid for path, tid in stub.posts if path == "/v1/tasks")
    assert sorted(accepted) == sorted(str(f.inbox_item_id) for f in fires)
    assert set(accepted.values()) == {1}, [k for k, n in accepted.items() if n > 1]
    submits = AuditLog.objects.filter(action=AuditAction.TASK_SUBMIT, data__item__in=list(accepted)).count()
    assert submits == len(fires)
    return len(fires)


# --- catch-up after an outage (a fixed clock: the schedule was made a day before the next sweep) ---------------


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "expected_hours", "skipped"), [
    ("skip", [], 24),
    ("latest", [24], 23),
    ("all", list(range(15, 25)), 14),  # the newest 10 of the 24 missed
])
def test_each_catch_up_policy_after_a_day_of_downtime(operator, policy, expected_hours, skipped):
    tenant, stub = stub_tenant(operator)
    try:
        schedule = make(tenant, catch_up=policy, catch_up_max=10)
        assert schedule.next_fire_at == datetime(2026, 1, 1, 1, tzinfo=UTC)
        back = datetime(2026, 1, 2, 0, 30, tzinfo=UTC)  # 24 hourly times passed (01:00 .. 00:00) while down
        schedules_sweep(now=back)
        assert fire_times(schedule) == [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in expected_hours]
        schedule.refresh_from_db()
        assert schedule.skipped_fires == skipped
        assert schedule.next_fire_at == datetime(2026, 1, 2, 1, tzinfo=UTC)
        # Back to normal: the next time fires when due (a few seconds late is on time), whatever the policy.
        schedules_sweep(now=datetime(2026, 1, 2, 1, 0, 3, tzinfo=UTC))
        assert fire_times(schedule)[-1] == datetime(2026, 1, 2, 1, tzinfo=UTC)
        assert schedules_sweep(now=datetime(2026, 1, 2, 1, 0, 4, tzinfo=UTC)).created == 0
        assert assert_each_fire_once_at_the_instance(stub, [schedule]) == len(expected_hours) + 1
    finally:
        stub.stop()


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["skip", "latest", "all"])
def test_catch_up_in_real_time_with_a_schedule_every_second(operator, settings, policy):
    settings.SCHEDULES_MISFIRE_GRACE_S = 1.0
    tenant, stub = stub_tenant(operator)
    try:
        schedule = make(tenant, cron="* * * * * *", catch_up=policy, catch_up_max=2, now=timezone.now())
        cursor = schedule.next_fire_at
        time.sleep(4.2)  # beat is "down": four or five fire times pass
        now = timezone.now()
        schedules_sweep(now=now)
        boundary = now - timedelta(seconds=1)
        times = fire_times(schedule)
        missed = [t for t in times if t < boundary]
        assert len(missed) == {"skip": 0, "latest": 1, "all": 2}[policy]
        assert [t for t in times if t >= boundary] and all(t <= now for t in times)
        if missed:  # the newest missed ones: the last whole second before the boundary
            whole = boundary.replace(microsecond=0)
            assert missed[-1] == (whole if whole < boundary else whole - timedelta(seconds=1))
        schedule.refresh_from_db()
        missed_in_all = int((boundary - cursor).total_seconds()) + 1 if boundary > cursor else 0
        assert missed_in_all >= 3 and schedule.skipped_fires == missed_in_all - len(missed)
        assert_each_fire_once_at_the_instance(stub, [schedule])
    finally:
        stub.stop()


@pytest.mark.django_db
def test_a_schedule_every_second_fires_every_second_once_under_repeated_sweeps(operator):
    tenant, stub = stub_tenant(operator)
    try:
        schedule = make(tenant, cron="* * * * * *", now=timezone.now())
        deadline = time.monotonic() + 3.2
        while time.monotonic() < deadline:
            schedules_sweep()
            time.sleep(0.3)
        times = fire_times(schedule)
        assert len(times) >= 3
        assert [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)] == [1.0] * (len(times) - 1)
        assert assert_each_fire_once_at_the_instance(stub, [schedule]) == len(times)
    finally:
        stub.stop()


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "fires"), [("skip", 0), ("latest", 1)])
def test_a_one_off_fires_once_and_a_missed_one_follows_the_policy(operator, policy, fires):
    tenant, stub = stub_tenant(operator)
    try:
        at = T0 + timedelta(hours=1)
        on_time = make(tenant, name="on-time", cron=None, at=at, catch_up=policy)
        # Made two days before, due a day before the sweep: beat was down when it was due.
        missed = make(tenant, name="missed", cron=None, at=at - timedelta(days=1), catch_up=policy,
                      now=at - timedelta(days=2))
        schedules_sweep(now=at + timedelta(seconds=5))
        assert fire_times(on_time) == [at]
        assert len(fire_times(missed)) == fires
        assert set(Schedule.objects.filter(tenant=tenant).values_list("status", flat=True)) == {"completed"}
        assert schedules_sweep(now=at + timedelta(days=2)).created == 0
        assert_each_fire_once_at_the_instance(stub, [on_time, missed])
    finally:
        stub.stop()


@pytest.mark.django_db
def test_pausing_is_not_downtime_times_that_passed_while_paused_never_fire(operator):
    tenant, stub = stub_tenant(operator)
    try:
        hourly = make(tenant, name="hourly", catch_up="all")
        once = make(tenant, name="once", cron=None, at=T0 + timedelta(hours=1), catch_up="all")
        for schedule in (hourly, once):
            schedule_update(schedule=schedule, changes={"paused": True}, actor=SYSTEM, now=T0 + timedelta(minutes=1))
        assert schedules_sweep(now=T0 + timedelta(hours=5)).created == 0
        later = T0 + timedelta(hours=5, minutes=10)
        hourly = schedule_update(schedule=hourly, changes={"paused": False}, actor=SYSTEM, now=later)
        once = schedule_update(schedule=once, changes={"paused": False}, actor=SYSTEM, now=later)
        assert (hourly.status, hourly.next_fire_at) == ("active", T0.replace(second=0) + timedelta(hours=6))
        assert (once.status, once.next_fire_at) == ("completed", None)
        schedules_sweep(now=T0 + timedelta(hours=6, seconds=1))
        assert fire_times(hourly) == [T0.replace(second=0) + timedelta(hours=6)] and fire_times(once) == []
        assert assert_each_fire_once_at_the_instance(stub, [hourly, once]) == 1
    finally:
        stub.stop()


@pytest.mark.django_db
def test_a_fire_over_the_plan_s_daily_quota_is_failed_with_the_reason_and_not_retried(operator):
    tenant, stub = stub_tenant(operator)
    try:
        tenant.plan = Plan.objects.create(slug="one-a-day", name="One a day", max_tasks_per_day=1)
        tenant.save()
        schedule = make(tenant, catch_up="all", catch_up_max=3)
        schedules_sweep(now=datetime(2026, 1, 1, 4, 0, 1, tzinfo=UTC))  # 01:00-03:00 missed, 04:00 on time
        fires = list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_time"))
        assert [f.status for f in fires] == ["dispatched", "failed", "failed", "failed"]
        assert all("one-a-day" in f.error and f.attempts == 1 for f in fires[1:])
        schedules_sweep(now=datetime(2026, 1, 1, 4, 0, 2, tzinfo=UTC))
        assert ScheduleFire.objects.get(pk=fires[1].pk).attempts == 1  # refused for good: not tried again
        assert len(stub.posts) == 1
    finally:
        stub.stop()


@pytest.mark.django_db
def test_a_message_schedule_posts_into_its_thread(operator):
    tenant, stub = stub_tenant(operator)
    try:
        schedule = make(tenant, message={"thread": "mornings", "content": "Reconcile my invoices"})
        schedules_sweep(now=datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC))
        schedules_sweep(now=datetime(2026, 1, 1, 1, 0, 2, tzinfo=UTC))
        fire = ScheduleFire.objects.select_related("inbox_item").get(schedule=schedule)
        assert fire.inbox_item.kind == "message" and fire.inbox_item.thread == "mornings"
        assert [m["content"] for m in stub.user_messages("mornings")] == ["Reconcile my invoices"]
        assert [tid for path, tid in stub.posts] == [str(fire.inbox_item_id)]
    finally:
        stub.stop()


@pytest.mark.django_db
def test_a_suspended_customer_s_fire_waits_in_the_inbox_and_is_delivered_once_on_resume(operator):
    tenant, stub = stub_tenant(operator)
    try:
        schedule = make(tenant)
        tenant.status = "suspended"
        tenant.save()
        schedules_sweep(now=datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC))
        fire = ScheduleFire.objects.select_related("inbox_item").get(schedule=schedule)
        assert (fire.status, fire.inbox_item.status, stub.posts) == ("dispatched", "pending", [])
        schedules_sweep(now=datetime(2026, 1, 1, 1, 0, 5, tzinfo=UTC))  # nothing twice while it waits
        tenant.status = "ready"
        tenant.save()
        inbox_deliver(tenant=tenant)
        assert assert_each_fire_once_at_the_instance(stub, [schedule]) == 1
    finally:
        stub.stop()


# --- exactly once under races and kills (committed rows: other connections and processes must see them) -------


def _outage_schedules(tenant: Any, count: int) -> list[Schedule]:
    """Schedules every second, down for an hour: each has 10 missed times (catch-up all) and a few on time."""
    past = timezone.now() - timedelta(hours=1)
    return [make(tenant, name=f"every-second-{i}", cron="* * * * * *", catch_up="all", catch_up_max=10, now=past)
            for i in range(count)]


@pytest.mark.django_db(transaction=True)
def test_sweeps_racing_in_threads_dispatch_each_fire_once(operator, settings):
    settings.SCHEDULES_MISFIRE_GRACE_S = 3.0
    tenant, stub = stub_tenant(operator)
    try:
        schedules = _outage_schedules(tenant, 5)
        now = timezone.now().replace(microsecond=0)
        barrier, errors = threading.Barrier(8), []

        def sweep() -> None:
            try:
                barrier.wait()
                schedules_sweep(now=now)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=sweep) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        assert {len(fire_times(s)) for s in schedules} == {10 + 4}  # 10 missed, and now-3 s .. now on time
        assert assert_each_fire_once_at_the_instance(stub, schedules) == 70
    finally:
        stub.stop()


@pytest.mark.django_db(transaction=True)
def test_sweeps_racing_in_processes_dispatch_each_fire_once(operator):
    tenant, stub = stub_tenant(operator)
    try:
        schedules = _outage_schedules(tenant, 4)
        now = timezone.now().replace(microsecond=0)
        start_at = time.time() + 6  # every process is up by then, so they sweep together
        code = ("import time; from datetime import datetime; from schedules.sweep import schedules_sweep; "
                f"time.sleep(max(0, {start_at} - time.time())); "
                f"schedules_sweep(now=datetime.fromisoformat({now.isoformat()!r}))")
        env = subprocess_env(SCHEDULES_MISFIRE_GRACE_S="3")
        procs = [subprocess.Popen([sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(4)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-2000:]
        assert {len(fire_times(s)) for s in schedules} == {10 + 4}
        assert assert_each_fire_once_at_the_instance(stub, schedules) == 56
    finally:
        stub.stop()


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_creating_fires_and_before_dispatching_them_is_finished_by_the_next_sweep(
        operator, worker_factory):
    from schedules.tasks import schedules_sweep_task

    tenant, stub = stub_tenant(operator)
    try:
        schedules = _outage_schedules(tenant, 2)
        worker = worker_factory(SCHEDULES_PAUSE_S="120", SCHEDULES_PAUSE_AT="materialized",
                                SCHEDULES_MISFIRE_GRACE_S="3")
        schedules_sweep_task.delay()
        wait_for(lambda: ScheduleFire.objects.filter(schedule__in=schedules).count() >= 2 * 11, timeout=90,
                 what="the worker's fire rows")
        time.sleep(0.5)
        worker.kill()  # SIGKILL, in the pause after the commit
        created = list(ScheduleFire.objects.filter(schedule__in=schedules).values_list("pk", "status"))
        assert {status for _, status in created} == {"pending"}
        assert stub.posts == [] and not InboxItem.objects.filter(tenant=tenant).exists()
        schedules_sweep()  # the next sweep (it also materialises what became due since)
        fired = set(ScheduleFire.objects.filter(schedule__in=schedules).values_list("pk", flat=True))
        assert {pk for pk, _ in created} <= fired
        assert_each_fire_once_at_the_instance(stub, schedules)
    finally:
        stub.stop()


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_the_inbox_took_a_fire_and_before_marking_it_causes_no_second_submission(
        operator, worker_factory):
    from schedules.tasks import schedules_sweep_task

    tenant, stub = stub_tenant(operator)
    try:
        at = timezone.now().replace(microsecond=0) + timedelta(seconds=1)
        schedule = make(tenant, name="once", cron=None, at=at, now=at - timedelta(seconds=1))
        time.sleep(1.2)
        worker = worker_factory(SCHEDULES_PAUSE_S="120", SCHEDULES_PAUSE_AT="submitted")
        schedules_sweep_task.delay()
        wait_for(lambda: InboxItem.objects.filter(tenant=tenant).exists(), timeout=90, what="the inbox item")
        time.sleep(0.5)
        worker.kill()  # the inbox item is committed (delivered after the sweep's fires); the fire is still pending
        fire = ScheduleFire.objects.get(schedule=schedule)
        assert (fire.status, fire.inbox_item_id) == ("pending", None)
        item = InboxItem.objects.get(idempotency_key=fire.idempotency_key)
        assert not stub.posts
        schedules_sweep()
        fire.refresh_from_db()
        assert (fire.status, fire.inbox_item_id, fire.attempts) == ("dispatched", item.pk, 2)
        assert assert_each_fire_once_at_the_instance(stub, [schedule]) == 1
    finally:
        stub.stop()
