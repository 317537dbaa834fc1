"""Schedules soak: every-minute schedules of one customer for a few minutes, fired by a real beat and a real Celery
worker into a real agent-host; how many fire times ran exactly once, and how late, against the sweep's own interval
measured in the same run.

``BENCH_SCHEDULES`` schedules (20), each ``* * * * *``, for ``BENCH_SCHEDULE_MINUTES`` minutes (2; the issue's soak
is ``BENCH_SCHEDULE_MINUTES=10``). Then they are paused, what is due is drained, and each fire is matched with its
task at the instance. Figures: fire times expected (each schedule's cron times from its creation to its last fire:
a gap is a lost fire time) and fired once (one inbox item per fire key, its task done once at the instance);
lateness, from the fire time to the instance having the task (the inbox item's delivery), p50/p95/max. Anchors in
the same run: the sweep interval (``SCHEDULES_SWEEP_INTERVAL_S``: a fire due just after a sweep waits for the next
one, so lateness p95 is about one interval plus the inbox's delivery) and a task submitted straight into the inbox
every 10 s (submit -> delivered: what the inbox itself adds). Smoke (``BENCH_SMOKE=1``): 3 schedules every 5 seconds
(six-field cron) for 20 s.

Real parts: PostgreSQL, Redis as the broker (``BENCH_REDIS_URL``, default redis://127.0.0.1:6379/9), a Celery worker,
``celery beat`` with django-celery-beat's scheduler, an agent-host running the test agents (`tick`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
from bench import _run, _setup  # noqa: E402

N = _run.size("BENCH_SCHEDULES", 20, smoke=3)
DURATION_S = _run.seconds("BENCH_SCHEDULE_MINUTES", 2, smoke=20 / 60) * 60
CRON = "* * * * * */5" if _run.SMOKE else "* * * * *"
ANCHOR_EVERY_S = 10.0
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS"}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402
from django_celery_beat.models import PeriodicTask  # noqa: E402
from psycopg import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _stack  # noqa: E402
from conversations.models import InboxItem  # noqa: E402
from conversations.services import task_submit  # noqa: E402
from provisioning.drivers.pg_admin import admin_connect  # noqa: E402
from schedules.cron import next_fires, zone_validate  # noqa: E402
from schedules.models import ScheduleFire  # noqa: E402
from schedules.services import schedule_create, schedule_update  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402

console = Console(width=140)
JOBS = {"schedules.tasks.schedules_sweep_task", "conversations.tasks.inbox_deliver_pending",
        "provisioning.tasks.instance_sleep_sweep_task"}


def _beat(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=WARNING",
                             "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler", "--pidfile="],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(what: str, done: object, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _tasks_done(resource_name: str) -> dict[str, int]:
    """Task id -> finished steps, for the tasks that are done, read from the tenant's own schema."""
    with admin_connect(autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT t.id::text, (SELECT count(*) FROM {s}.step_events e WHERE e.task_id = t.id AND e.event = 'done')"
            " FROM {s}.tasks t WHERE t.status = 'done'").format(s=sql.Identifier(resource_name))).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def main() -> None:
    call_command("migrate", verbosity=0)
    PeriodicTask.objects.exclude(task__in=JOBS).update(enabled=False)  # no recovery of a host without heartbeats
    settings.INSTANCE_EXTRA_ENV = EXTRA
    env = dict(os.environ)
    interval_s = float(settings.SCHEDULES_SWEEP_INTERVAL_S)
    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instances", _setup.stop_hosts)
        worker = _stack.worker(env)
        beat = _beat(env)
        cleanup.add("stop the worker and beat", _stack.stop, [worker, beat])
        operator, _token = _stack.operator_with_token("bench-schedules")
        tenant = _stack.onboard(operator, "schedules")
        made_at = timezone.now()
        schedules = [schedule_create(tenant=tenant, name=f"soak-{i:03d}", cron=CRON, timezone_name="UTC", at=None,
                                     task={"kind": "tick", "params": {"schedule": i}}, message=None, catch_up="all",
                                     catch_up_max=100, actor=SYSTEM, now=made_at) for i in range(N)]
        console.print(f"{N} schedules `{CRON}` for {DURATION_S:.0f} s (sweep every {interval_s:g} s) ...")
        anchor_ids: list[str] = []
        end = time.monotonic() + DURATION_S
        while time.monotonic() < end:
            accepted = task_submit(tenant=tenant, kind="tick", params={"schedule": "anchor"}, idempotency_key=None,
                                   actor=SYSTEM)
            anchor_ids.append(str(accepted.item.pk))
            time.sleep(min(ANCHOR_EVERY_S, max(0.0, end - time.monotonic())))
        for schedule in schedules:
            schedule_update(schedule=schedule, changes={"paused": True}, actor=SYSTEM)
        _wait("every fire dispatched", lambda: not ScheduleFire.objects.filter(tenant=tenant,
                                                                              status="pending").exists())
        _wait("every fire delivered", lambda: not InboxItem.objects.filter(tenant=tenant, status="pending").exists())
        fires = list(ScheduleFire.objects.filter(tenant=tenant).select_related("inbox_item"))
        wanted = {str(f.inbox_item_id) for f in fires} | set(anchor_ids)
        _wait("every task done at the instance", lambda: wanted <= set(_tasks_done(tenant.resource_name)))
        done = _tasks_done(tenant.resource_name)

    # Expected: every cron time of each schedule from its creation to its last fire (the pause stops it; a time the
    # last sweep before the pause had not reached was never due). A gap in between is a fire time lost.
    zone = zone_validate("UTC")
    last: dict[int, object] = {}
    for f in fires:
        i = int(f.target["params"]["schedule"])
        last[i] = max(last.get(i, f.fire_time), f.fire_time)  # type: ignore[type-var]
    cron_times = next_fires(CRON, zone, start=made_at + timedelta(seconds=1), count=10_000)
    expected = sum(len([t for t in cron_times if t <= last[i]]) for i in last)
    if len(last) < N:
        raise SystemExit(f"{N - len(last)} schedules never fired in {DURATION_S:.0f} s")
    per_key = Counter(InboxItem.objects.filter(tenant=tenant, idempotency_key__startswith="schedule:")
                      .values_list("idempotency_key", flat=True))
    once = sum(1 for f in fires if per_key.get(f.idempotency_key) == 1 and done.get(str(f.inbox_item_id)) == 1)
    twice = sum(1 for n in per_key.values() if n > 1) + sum(1 for f in fires if done.get(str(f.inbox_item_id), 0) > 1)
    late = [(f.inbox_item.delivered_at - f.fire_time).total_seconds() for f in fires
            if f.inbox_item is not None and f.inbox_item.delivered_at is not None]
    items = {str(i.pk): i for i in InboxItem.objects.filter(pk__in=anchor_ids)}
    anchor = [(items[i].delivered_at - items[i].created_at).total_seconds() for i in anchor_ids
              if items[i].delivered_at is not None]
    l50, l95 = _setup.percentiles(late)
    a50, a95 = _setup.percentiles(anchor)
    table = Table(title="Schedules soak: each fire time once, and how late (same run)")
    for col in ("measure", "value", "against the anchor"):
        table.add_column(col)
    table.add_row("fire times expected (each schedule's cron times, creation to last fire)", str(expected), "")
    table.add_row("fired exactly once (one inbox item, its task done once)", str(once),
                  f"{once / expected:.3f} of expected" if expected else "")
    table.add_row("fired twice or more", str(twice), "goal 0")
    table.add_row(f"lateness: fire time -> instance has the task (n={len(late)})",
                  f"p50 {l50 / 1000:.2f} s, p95 {l95 / 1000:.2f} s, max {max(late, default=0):.2f} s",
                  f"sweep interval {interval_s:g} s: p95 {l95 / 1000 / interval_s:.2f}x")
    table.add_row(f"anchor: task straight into the inbox, submit -> delivered (n={len(anchor)})",
                  f"p50 {a50 / 1000:.2f} s, p95 {a95 / 1000:.2f} s", "what the inbox itself adds")
    console.print(table)
    if expected:
        _run.ratio_line("schedules", "fire times run exactly once / expected", once / expected,
                        f"({expected} expected, {twice} twice)")
    _run.ratio_line("schedules", "lateness p95 / sweep interval", l95 / 1000 / interval_s,
                    f"(p95 {l95 / 1000:.2f} s, max {max(late, default=0):.2f} s; interval {interval_s:g} s; inbox "
                    f"submit -> delivered p50 {a50:.0f} ms)")
    _run.write_json("schedules", {
        "schedules": N, "cron": CRON, "duration_s": DURATION_S, "sweep_interval_s": interval_s,
        "expected": expected, "fired_once": once, "twice": twice,
        "lateness_ms": {"p50": l50, "p95": l95, "max": max(late, default=0) * 1000},
        "inbox_submit_to_delivered_ms": {"p50": a50, "p95": a95}})
    if twice or (expected and once < expected):
        raise SystemExit(f"not exactly once: {once} of {expected} fired once, {twice} twice or more")


if __name__ == "__main__":
    main()
