"""Limits per plan, enforced by the kernel, tried from inside a real sandboxed instance (issue 38).

Each probe runs exactly as the instance does (``instance_command``: its cgroup, its sandbox, its uid, its rlimits,
its environment) while the tenant's agent-host runs. The plan is made small here (the machine is shared): 160 MiB
of memory, 48 pids, half a core, 32 MiB of storage; the probes go past each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from provisioning.drivers.local_limits import instance_cgroup_dirs, oom_kills, own_cgroup_line
from provisioning.drivers.local_process import LocalProcessDriver, instance_command, live_host_pid
from provisioning.drivers.local_sandbox import sandbox_support
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from provisioning.workflows.steps import (
    StepContext,
    step_database,
    step_objectstore,
    step_runtime,
    step_vault,
    step_volume,
)
from tenants.actors import SYSTEM
from tenants.models import Tenant

pytestmark = pytest.mark.django_db

MEMORY = 160 * 2**20
PIDS = 48
STORAGE = 32 * 2**20

ALLOCATE = r'''
import sys
chunks = []
for i in range(16):  # 256 MiB in 16 MiB steps, every page touched
    chunks.append(bytearray(16 * 2**20))
    print(f"allocated {(i + 1) * 16} MiB", flush=True)
print("done", flush=True)
'''

FORK = r'''
import errno, json, os, time
children, error = [], ""
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps({"forked": len(children), "error": error}))
'''

WRITE = r'''
import errno, json, os, sys
path = os.path.join(os.environ["AGENT_VOLUME"], "big.bin")
written, error = 0, ""
try:
    with open(path, "wb", buffering=0) as fh:
        block = b"x" * 2**20
        for _ in range(int(sys.argv[1]) // 2**20 + 2):
            written += fh.write(block)
except OSError as exc:
    error = errno.errorcode.get(exc.errno, str(exc.errno))
os.unlink(path)
print(json.dumps({"written": written, "error": error}))
'''


def _started(operator: Any, settings: Any) -> Tenant:
    ok, why = sandbox_support()
    if not ok:
        pytest.skip(f"this machine cannot sandbox instances: {why}")
    settings.KUBERNETES_PLANS = {**settings.KUBERNETES_PLANS, "standard": {
        **settings.KUBERNETES_PLANS["standard"], "memory_limit": "160Mi", "pids": str(PIDS), "cpu_limit": "500m",
        "storage": "32Mi"}}
    tenant, _ = tenant_onboard(operator=operator, slug="limits", name="Limited customer", actor=SYSTEM,
                               allow_no_release=True)
    ctx = StepContext(tenant)
    for step in (step_database, step_volume, step_objectstore, step_vault, step_runtime):
        step(ctx)
    return tenant


@pytest.fixture
def instance(operator, settings) -> Iterator[Tenant]:  # type: ignore[no-untyped-def]
    tenant = _started(operator, settings)
    yield tenant
    LocalProcessDriver().stop(_spec(tenant), grace_s=10)


@pytest.fixture
def imaged_instance(operator, settings) -> Iterator[Tenant]:  # type: ignore[no-untyped-def]
    """The same, its volume an image of the plan's storage (the product's default where it can loop-mount)."""
    from provisioning.drivers.local_volume_image import image_support, remove_image_volume

    ok, why = image_support()
    if not ok:
        pytest.skip(f"no loop mounts here: {why}")
    settings.LOCAL_VOLUME_QUOTA = "auto"
    tenant = _started(operator, settings)
    volume = Path(_spec(tenant).resources["volume"].details["path"])
    try:
        yield tenant
    finally:
        LocalProcessDriver().stop(_spec(tenant), grace_s=10)
        remove_image_volume(volume)


def _spec(tenant: Tenant) -> Any:
    return tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))


def _as_instance(tenant: Tenant, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = instance_command(_spec(tenant), [sys.executable, "-c", code, *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_host_runs_in_its_own_cgroup_with_its_plans_limits(instance) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(instance)
    host = live_host_pid(spec)
    assert host is not None
    where = own_cgroup_line(host)
    dirs = instance_cgroup_dirs(spec.resource_name)
    for controller in ("memory", "pids", "cpu"):
        line = next(x for x in where.splitlines() if controller in x.split(":")[1].split(","))
        assert line.endswith(f"/agent-instances/{spec.resource_name}"), where
    by_controller = {d.parent.parent.name if d.parent.name == "agent-instances" else "": d for d in dirs}
    memory = next(d for d in dirs if (d / "memory.limit_in_bytes").exists())
    assert int((memory / "memory.limit_in_bytes").read_text()) == MEMORY, by_controller
    pids = next(d for d in dirs if (d / "pids.max").exists())
    assert (pids / "pids.max").read_text().strip() == str(PIDS)
    cpu = next(d for d in dirs if (d / "cpu.cfs_quota_us").exists())
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 50_000
    limits = Path(f"/proc/{host}/limits").read_text()  # the second line, inherited by the host from prlimit
    assert f"Max processes             {PIDS * 2}" in limits and f"Max file size             {STORAGE}" in limits


def test_allocating_past_the_plans_memory_is_killed_by_the_kernel(instance) -> None:  # type: ignore[no-untyped-def]
    name = _spec(instance).resource_name
    before = oom_kills(name)
    assert before is not None
    done = _as_instance(instance, ALLOCATE)
    assert "done" not in done.stdout, done.stdout
    assert "allocated 16 MiB" in done.stdout and "allocated 256 MiB" not in done.stdout
    kills = oom_kills(name)
    assert kills is not None and kills > before, (done.returncode, done.stdout[-300:], done.stderr[-300:])


def test_forking_past_the_plans_pids_fails_with_eagain_inside(instance) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(instance)
    pids = next(d for d in instance_cgroup_dirs(spec.resource_name) if (d / "pids.max").exists())
    events = pids / "pids.events"
    hits_before = int(events.read_text().split()[1]) if events.exists() else None
    out = json.loads(_as_instance(instance, FORK).stdout)
    assert out["error"] == "EAGAIN" and 0 < out["forked"] < PIDS, out
    if hits_before is not None:  # the cgroup refused it (the rlimit is set at twice the pids limit)
        assert int(events.read_text().split()[1]) > hits_before
    host = live_host_pid(spec)
    assert host is not None and psutil.Process(host).is_running()  # the host lives on, inside its limits


def test_a_file_past_the_plans_storage_fails_with_efbig(instance) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(_as_instance(instance, WRITE, str(STORAGE)).stdout)
    assert out["error"] == "EFBIG" and out["written"] == STORAGE, out


# Committed rows: the exit notice closes stale connections as the real one does in its own thread.
@pytest.mark.django_db(transaction=True)
def test_a_host_killed_at_its_memory_limit_is_recovered_with_reason_oom(instance) -> None:  # type: ignore[no-untyped-def]
    """The kernel kills the host itself (told, by the test as root, to pick it first, as it would a host that
    leaks); the exit notice its parent sends starts a recovery whose reason, and the instance's status reason,
    say ``oom``. A ``kill -9`` of a healthy host (the next test) stays ``dead``."""
    from provisioning.models import AgentInstance, RecoveryEvent
    from provisioning.recovery.exit_notice import on_exit
    from provisioning.workflows.steps import step_ready

    step_ready(StepContext(instance))
    spec = _spec(instance)
    host = live_host_pid(spec)
    assert host is not None
    Path(f"/proc/{host}/oom_score_adj").write_text("1000")
    _as_instance(instance, ALLOCATE)
    assert not psutil.pid_exists(host) or psutil.Process(host).status() == psutil.STATUS_ZOMBIE
    assert on_exit(str(instance.pk), pid=host, returncode=-9) == "recovery started"
    event = RecoveryEvent.objects.get(tenant=instance)
    assert event.reason == "oom", event.detail
    assert AgentInstance.objects.get(tenant=instance).status_reason.startswith("oom: "), event.detail


@pytest.mark.django_db(transaction=True)
def test_a_host_killed_by_a_signal_is_dead_not_oom(instance) -> None:  # type: ignore[no-untyped-def]
    from provisioning.models import RecoveryEvent
    from provisioning.recovery.exit_notice import on_exit
    from provisioning.workflows.steps import step_ready

    step_ready(StepContext(instance))
    host = live_host_pid(_spec(instance))
    assert host is not None
    psutil.Process(host).kill()
    psutil.Process(host).wait(10) if psutil.pid_exists(host) else None
    assert on_exit(str(instance.pk), pid=host, returncode=-9) == "recovery started"
    assert RecoveryEvent.objects.get(tenant=instance).reason == "dead"


def test_the_posture_has_a_line_for_resource_limits() -> None:
    from provisioning.fleet.posture import isolation_posture

    ok, why = sandbox_support()
    if not ok:
        pytest.skip(f"this machine cannot sandbox instances: {why}")
    line = next(x for x in isolation_posture() if x.boundary == "resource limits")
    assert line.status == "pass" and "own cgroup" in line.detail, line
    disk = next(x for x in isolation_posture() if x.boundary == "disk quota")
    assert disk.status == "degraded" and "LOCAL_VOLUME_QUOTA=off" in disk.detail, disk  # the suite's setting


def test_writing_past_the_plans_storage_is_enospc_in_the_volume_only(imaged_instance) -> None:  # type: ignore[no-untyped-def]
    from provisioning.drivers.local_volume_image import image_path

    spec = _spec(imaged_instance)
    volume = Path(spec.resources["volume"].details["path"])
    assert volume.is_mount() and spec.resources["volume"].details["volume_quota"] == "image"
    fs = os.statvfs(volume)
    assert fs.f_blocks * fs.f_frsize <= STORAGE
    out = json.loads(_as_instance(imaged_instance, WRITE, str(STORAGE * 4)).stdout)  # past RLIMIT_FSIZE too
    assert out["error"] == "ENOSPC" and 0 < out["written"] < STORAGE, out
    # What the machine's disk paid: the (sparse) image's blocks, never more than the plan's storage.
    assert image_path(volume).stat().st_blocks * 512 <= STORAGE
    host = live_host_pid(spec)
    assert host is not None and psutil.Process(host).is_running()
    with (volume / ".host" / "probe").open("w") as fh:  # and the volume is usable again once the file is gone
        fh.write("ok")
