"""Issue 35, schedules under kills: a real beat (django-celery-beat's DatabaseScheduler, reading the declared job)
and a real Celery worker fire a schedule every second while each is SIGKILLed and restarted. Every fire time from
the first to the last fires, and reaches the instance once (counted at the protocol stub).

One schedule, about twenty seconds; 100 schedules with the instance asleep are
tests/schedules/test_schedules_hundred.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from controlplane.periodic import periodic_jobs_sync
from conversations.services import inbox_deliver
from schedules.models import ScheduleFire
from schedules.sweep import schedules_sweep
from tests.conftest import BASE_DIR, SESSION_TMP, subprocess_env, wait_for
from tests.conversation_helpers import stub_tenant
from tests.schedules.test_schedules_sweep import assert_each_fire_once_at_the_instance, make

SWEEP_TASK = "schedules.tasks.schedules_sweep_task"


class Beat:
    def __init__(self) -> None:
        self.log_path = SESSION_TMP / f"beat-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO",
             "--scheduler", "controlplane.leases.beat:LeaderScheduler", "--pidfile="],
            cwd=BASE_DIR, env=subprocess_env(), stdout=self._log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()


@pytest.mark.django_db(transaction=True)
def test_beat_and_worker_killed_and_restarted_lose_and_double_no_fire(operator, settings, worker_factory):
    # Only the schedules sweep runs, every second (the other jobs would try to recover the stub's "instance").
    settings.SCHEDULES_SWEEP_INTERVAL_S = 1.0
    periodic_jobs_sync()
    PeriodicTask.objects.exclude(task=SWEEP_TASK).update(enabled=False)
    tenant, stub = stub_tenant(operator)
    beats: list[Beat] = []
    try:
        schedule = make(tenant, cron="* * * * * *", catch_up="all", catch_up_max=100, now=timezone.now())
        worker = worker_factory()
        beats.append(Beat())
        wait_for(lambda: ScheduleFire.objects.filter(schedule=schedule, status="dispatched").exists(), timeout=90,
                 what="a first fire through beat and the worker")
        time.sleep(2)
        worker.kill()  # SIGKILL the worker
        time.sleep(2)
        worker = worker_factory()
        time.sleep(3)
        beats[-1].kill()  # SIGKILL beat
        time.sleep(2)
        beats.append(Beat())
        time.sleep(4)
        worker.kill()
        beats[-1].kill()
        stopped = timezone.now()
        by_processes = ScheduleFire.objects.filter(schedule=schedule, status="dispatched").count()
        schedules_sweep(now=stopped)  # whatever the killed ones left pending, and the seconds since
        # A worker killed between a fire's dispatch (its inbox item committed) and the delivery leaves the item
        # pending in the inbox, which the inbox's own periodic job delivers (disabled above); the sweep delivers a
        # customer's inbox only when it dispatched something itself, which it need not have here.
        inbox_deliver(tenant=tenant)
        times = list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_time")
                     .values_list("fire_time", flat=True))
        assert times[-1] > stopped - timedelta(seconds=1)
        assert [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)] == [1.0] * (len(times) - 1)
        assert len(times) >= 12 and by_processes >= len(times) // 2  # beat and the workers did most of it
        assert assert_each_fire_once_at_the_instance(stub, [schedule]) == len(times)
    finally:
        for beat in beats:
            beat.kill()
        stub.stop()
