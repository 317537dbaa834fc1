"""The job kernel (controlplane/jobs) against real PostgreSQL, Redis and processes.

Two drivers racing for one job (threads, then a live process): exactly one drives. A driver SIGKILLed mid-step:
its lease goes with its connection, the sweep leaves the job alone until the stall time has passed, then queues
it and a real worker finishes it. The pause knob is refused without the fault-injection switch.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils import timezone

from controlplane.jobs import (
    JobKind,
    Outcome,
    cursor_batches,
    job_drive,
    job_kind_register,
    job_kind_unregister,
    job_kinds,
    job_pause,
    job_progress,
    job_stall_after_s,
    jobs_resume_stalled,
)
from tenants.actors import SYSTEM
from tests.conftest import BASE_DIR, subprocess_env, wait_for
from tests.vault.test_vault_helpers import make_tenant, ring_add_version
from vault.models import RotationJob, TenantDataKey
from vault.rotation import ROTATION_JOBS
from vault.services import credential_put, tenant_object_key

pytestmark = pytest.mark.django_db(transaction=True)


def _test_kind(run, **extra) -> JobKind:  # type: ignore[no-untyped-def]
    """A kind of our own on an existing table (the kernel owns none): rotation jobs' rows, our body."""
    return JobKind(name="kernel-test", model=RotationJob, active_statuses=("pending", "running"), run=run, **extra)


@pytest.fixture
def registered():  # type: ignore[no-untyped-def]
    kinds: list[str] = []

    def register(kind: JobKind) -> JobKind:
        kinds.append(kind.name)
        return job_kind_register(kind)

    yield register
    for name in kinds:
        job_kind_unregister(name)


def test_two_drivers_racing_for_one_job_exactly_one_drives(registered):
    entered = threading.Event()
    bodies: list[str] = []

    def run(job_id: str) -> str:
        bodies.append(job_id)
        entered.set()
        time.sleep(0.5)  # the other driver arrives while this one holds the lease
        job_progress("kernel-test", job_id, values={"status": "succeeded"}, add={"done": 1})
        return "drove"

    kind = registered(_test_kind(run))
    job = RotationJob.objects.create(kind="kek", target="kernel-test", total=1)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def driver() -> None:
        try:
            barrier.wait()
            outcomes.append(job_drive(kind, job.pk))
        finally:
            connection.close()  # each thread has its own connection, so its own advisory-lock session

    threads = [threading.Thread(target=driver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == [Outcome.BUSY, "drove"]
    assert bodies == [str(job.pk)]
    job.refresh_from_db()
    assert (job.status, job.done, job.started_at is not None) == ("succeeded", 1, True)
    assert job_drive(kind, job.pk) == Outcome.FINISHED  # finished: the body is not run again
    assert bodies == [str(job.pk)]


def test_a_drive_hands_its_params_to_the_body_and_a_deleted_job_is_missing(registered):
    seen: list[dict[str, object]] = []

    def run(job_id: str, **params: object) -> str:
        seen.append(params)
        job_progress("kernel-test", job_id, values={"status": "succeeded"})
        return "drove"

    kind = registered(_test_kind(run, marks_started=False))
    job = RotationJob.objects.create(kind="kek", target="kernel-test")
    assert job_drive(kind, job.pk, {"actor": {"kind": "system"}}) == "drove"
    assert seen == [{"actor": {"kind": "system"}}]
    job.refresh_from_db()
    assert job.started_at is None  # the kind said not to mark it
    job.delete()
    assert job_drive(kind, job.pk) == Outcome.MISSING  # answered, not raised: the task does not retry it
    assert seen == [{"actor": {"kind": "system"}}]


def _populate(operator, tenants: int) -> None:  # type: ignore[no-untyped-def]
    for _ in range(tenants):
        tenant = make_tenant(operator)
        credential_put(tenant=tenant, name="cred", value="kernel", actor=SYSTEM)
        tenant_object_key(tenant=tenant)


def test_a_driver_killed_mid_step_is_resumed_by_the_sweep_after_the_stall_time(operator, settings, worker_factory):
    _populate(operator, tenants=4)  # 8 data keys to re-wrap
    settings.VAULT_KEK_KEYRING = ring_add_version(settings.VAULT_KEK_KEYRING, "v2")
    settings.VAULT_ROTATION_STALL_AFTER_S = 4  # the kind's override of JOBS_STALL_AFTER_S
    # The row only, not kek_rotate_start: nothing is queued, so only the sweep can bring a worker to it.
    job = RotationJob.objects.create(kind="kek", target="local:v2", total=8)
    code = f"from vault.rotation import rotation_job_execute; rotation_job_execute({str(job.pk)!r})"
    env = subprocess_env(VAULT_ROTATION_PAUSE_PER_ITEM_S="0.5", VAULT_KEK_KEYRING=settings.VAULT_KEK_KEYRING)
    driver = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: RotationJob.objects.get(pk=job.pk).done >= 2, timeout=60, what="the driver's progress")
        assert job_drive(ROTATION_JOBS, job.pk) == Outcome.BUSY  # a live driver in another process holds it
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
    finally:
        driver.kill()
    killed = RotationJob.objects.get(pk=job.pk)
    assert killed.status == "running" and 2 <= killed.done < killed.total == 8
    assert jobs_resume_stalled() == 0  # it moved less than the stall time ago: left alone

    worker_factory()
    assert wait_for(lambda: jobs_resume_stalled(), timeout=30, what="the sweep to see the stall") == 1
    assert (timezone.now() - killed.updated_at).total_seconds() >= 4
    wait_for(lambda: RotationJob.objects.get(pk=job.pk).status == "succeeded", timeout=90, what="the resumed job")
    done = RotationJob.objects.get(pk=job.pk)
    assert done.done == 8 and done.cursor >= killed.cursor
    assert set(TenantDataKey.objects.values_list("kek_id", flat=True)) == {"local:v2"}


def test_the_pause_knob_is_refused_without_the_fault_injection_switch(settings, registered):
    kind = registered(_test_kind(lambda job_id: "", pause_setting="VAULT_ROTATION_PAUSE_PER_ITEM_S",
                                 pause_step_setting="PROVISIONING_PAUSE_STEP"))
    settings.VAULT_ROTATION_PAUSE_PER_ITEM_S = 0.3
    settings.PROVISIONING_PAUSE_STEP = ""
    settings.CONTROLPLANE_FAULT_INJECTION = False
    with pytest.raises(ImproperlyConfigured, match="CONTROLPLANE_FAULT_INJECTION=1"):
        job_pause(kind)
    settings.CONTROLPLANE_FAULT_INJECTION = True
    settings.PRODUCTION = True
    with pytest.raises(ImproperlyConfigured, match="refused in production"):
        job_pause(kind)
    settings.PRODUCTION = False
    began = time.monotonic()
    job_pause(kind, step="volume")
    assert time.monotonic() - began >= 0.3
    settings.PROVISIONING_PAUSE_STEP = "database"
    began = time.monotonic()
    job_pause(kind, step="volume")  # another step than the one named: no pause
    assert time.monotonic() - began < 0.2
    settings.VAULT_ROTATION_PAUSE_PER_ITEM_S = 0.0
    settings.CONTROLPLANE_FAULT_INJECTION = False
    job_pause(kind)  # knob off: nothing to refuse


def test_one_stall_setting_with_a_per_kind_override(settings, registered):
    settings.JOBS_STALL_AFTER_S = 42.0
    settings.VAULT_ROTATION_STALL_AFTER_S = 7.0
    assert job_stall_after_s(registered(_test_kind(lambda job_id: ""))) == 42.0
    assert job_stall_after_s(ROTATION_JOBS) == 7.0
    assert job_stall_after_s(_test_kind(lambda job_id: "", stall_after_s=3)) == 3.0
    assert {"vault-rotation", "kernel-test"} <= {k.name for k in job_kinds()}
    with pytest.raises(ImproperlyConfigured):
        job_kind_register(_test_kind(lambda job_id: "other body"))  # one name, one kind


def test_cursor_batches_walk_in_waves_and_resume_at_the_cursor():
    fleet = list(range(1, 12))
    fetched: list[int | None] = []

    def fetch(after: int | None) -> list[int]:
        fetched.append(after)
        return [i for i in fleet if after is None or i > after][:4]

    assert list(cursor_batches(fetch, cursor=None, key=int)) == fleet
    assert fetched == [None, 4, 8, 11]  # waves of four, then the empty batch that ends the walk
    assert list(cursor_batches(fetch, cursor=6, key=int)) == [7, 8, 9, 10, 11]
