"""Two control-plane "machines" on this one (issue 40), shared by the tests that kill one of them.

A ``Machine`` is a var/ directory and the processes a control-plane machine runs (gunicorn web, Celery workers, a
beat with ``LeaderScheduler``), each killable like the machine it stands for. The ``machines`` fixture gives two
that share nothing but PostgreSQL, Redis and the object store (moto's S3 server over HTTP); the instances'
control-plane URL is machine 2's web (the load balancer's, in production). Used by tests/test_two_machines.py
(onboarding and rollouts) and tests/test_two_machines_jobs.py (key rotation and database moves).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import requests
from django.conf import settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from controlplane.leases.beat import BEAT_LEASE
from controlplane.leases.models import Lease
from controlplane.periodic import periodic_jobs_sync
from controlplane.ports import free_port
from tests.conftest import BASE_DIR, SESSION_TMP, Worker, kill_session_instances, subprocess_env, wait_for
from tests.releases.test_release_store import MOTO_KEYS

from .k8s_fixtures import moto_server

__all__ = ["KEPT_JOBS", "LEASE_S", "RENEW_S", "Machine", "beat_leader", "machines", "only_the_sweeps"]

LEASE_S, RENEW_S = 3.0, 0.5  # the session's (tests/conftest.py subprocess_env)
KEPT_JOBS = ("controlplane.jobs.tasks.jobs_resume_stalled_task", "schedules.tasks.schedules_sweep_task")


class Machine:
    """One control-plane machine: its var/ and its processes (web, worker, beat), each killable like a machine's."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name = name
        self.var = SESSION_TMP / f"{name}-var-{secrets.token_hex(3)}"
        self.env = {**env, "CONTROLPLANE_VAR_DIR": str(self.var)}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.web: subprocess.Popen[bytes] | None = None
        self.beat: subprocess.Popen[bytes] | None = None
        self.workers: list[Worker] = []
        self._logs: list[Any] = []

    def _popen(self, what: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = open(SESSION_TMP / f"{self.name}-{what}.log", "ab")  # noqa: SIM115
        self._logs.append(log)
        return subprocess.Popen([sys.executable, "-m", *argv], cwd=BASE_DIR, env=subprocess_env(**self.env, **env),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_web(self) -> None:
        self.web = self._popen("web", ["gunicorn", "--config", str(BASE_DIR / "deploy/gunicorn.conf.py"),
                                       "controlplane.wsgi:application"],
                               GUNICORN_BIND=f"127.0.0.1:{self.port}", GUNICORN_WORKERS="2",
                               GUNICORN_WORKER_TMP_DIR=str(SESSION_TMP))

        def up() -> bool:
            try:
                return requests.get(f"{self.url}/healthz", timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout=90, what=f"{self.name}'s web up")

    def start_beat(self) -> None:
        self.beat = self._popen("beat", ["celery", "-A", "controlplane", "beat", "--loglevel=INFO", "--pidfile=",
                                         "--scheduler", "controlplane.leases.beat:LeaderScheduler"])

    def start_worker(self, **env: str) -> Worker:
        """A worker with this machine's env, plus ``env`` (a test-only pause, say)."""
        self.workers.append(Worker(**{**self.env, **env}))
        return self.workers[-1]

    def beat_log(self) -> str:
        return (SESSION_TMP / f"{self.name}-beat.log").read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL every process of this machine (gunicorn's workers with their master: its process group)."""
        for proc in (self.web, self.beat):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for worker in self.workers:
            worker.kill(signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        for worker in self.workers:
            worker.stop()
        for log in self._logs:
            log.close()
        shutil.rmtree(self.var, ignore_errors=True)


@pytest.fixture
def machines(sinks, make_token, operator) -> Iterator[tuple[Machine, Machine, dict[str, str]]]:  # type: ignore[no-untyped-def]
    with moto_server() as url:
        store = {"CONTROLPLANE_OBJECTSTORE": "s3", "S3_BUCKET": f"cp-{secrets.token_hex(6)}", "S3_ENDPOINT_URL": url,
                 "S3_CREATE_BUCKET": "true", **MOTO_KEYS}
        extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.5,AGENT_SMTP_URL={sinks['smtp']},"
                 f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=8")
        m2_port = free_port()
        env = {**store, "SECRET_KEY": settings.SECRET_KEY, "INSTANCE_EXTRA_ENV": extra,
               "CONTROL_PLANE_INTERNAL_URL": f"http://127.0.0.1:{m2_port}",
               "RELEASE_VALIDATION_TIMEOUT_S": "60", "RUNTIME_READY_TIMEOUT_S": "30", "RUNTIME_STOP_GRACE_S": "15",
               "RELEASE_GATE_POLL_S": "0.3", "WORKFLOW_STALL_AFTER_S": "5", "RELEASE_ROLLOUT_STALL_AFTER_S": "5",
               "VAULT_ROTATION_STALL_AFTER_S": "5",
               "RELEASE_ROLLOUT_CONCURRENCY": "1"}
        one, two = Machine("machine-1", env), Machine("machine-2", env)
        two.port, two.url = m2_port, f"http://127.0.0.1:{m2_port}"
        headers = {"Authorization": f"Bearer {make_token(operator)}"}
        try:
            yield one, two, headers
        finally:
            try:
                one.close()
            finally:
                two.close()
                kill_session_instances()


def only_the_sweeps(kept: Iterable[str] = KEPT_JOBS) -> None:
    """Beat runs only ``kept``: by default the stall sweep (every 2 s) and the schedules sweep (every 1 s); the other
    jobs would act on the tests' stub "instances" and only add noise."""
    settings.SCHEDULES_SWEEP_INTERVAL_S = 1.0
    periodic_jobs_sync()
    PeriodicTask.objects.exclude(task__in=list(kept)).update(enabled=False)
    every_2s, _ = IntervalSchedule.objects.get_or_create(every=2, period="seconds")
    PeriodicTask.objects.filter(task=KEPT_JOBS[0]).update(interval=every_2s)


def beat_leader() -> tuple[str, int] | None:
    """The beat lease's (holder, epoch); the holder reads ``host:pid:...``."""
    row = Lease.objects.filter(name=BEAT_LEASE).first()
    return (row.holder, row.epoch) if row else None
