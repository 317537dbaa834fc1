"""Issue 40, work follows the living: a machine lost mid-rotation and mid-move, the other one finishes both.

Two control-plane "machines" (tests/two_machines.py: nothing shared but PostgreSQL, Redis and moto's S3), a second
tenant database server (Debian's PostgreSQL 15, tests/pg_servers.py). Machine 1's beat leads and its two workers
hold two jobs: a tenant's data-key rotation (each credential re-encrypted under the new key, one per transaction)
and another tenant's database move (drain, copy, verify, switch, resume, drop_source). The kill lands mid-job by
watching the jobs' own progress rows, not by sleeping: the rotation's ``done`` counter past a few credentials, the
move's ``copy`` step running with its copy loaded on the target (the test-only pause holds the step there, its
effect done and not yet recorded). Every process of machine 1 is SIGKILLed; machine 2's beat takes the lease and
its stall sweep (every 2 s, ``*_STALL_AFTER_S`` = 5 s) hands both jobs to machine 2's worker, which finishes them:
every credential opens under the new key and those re-encrypted before the kill were not touched again; the moved
tenant's rows are on the new server exactly, its instance runs there and does new work; only the step in flight at
the kill ran twice.
"""

from __future__ import annotations

import secrets
import time

import pytest

from provisioning.databases.move import database_move_start
from provisioning.databases.servers import database_server_add, settings_server_ensure, tenant_database_server
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance, WorkflowRun, WorkflowStep
from tenants.actors import SYSTEM
from tests.conftest import onboard_ready, wait_for
from tests.provisioning.test_database_move import _durable, _loaded, _rows, _schema_on, second_server  # noqa: F401 (fixture)
from tests.vault.test_vault_helpers import make_tenant
from vault.models import CredentialVersion, RotationJob, TenantDataKey
from vault.rotation import data_key_rotate_start
from vault.services import credential_put, credential_reveal

from .two_machines import KEPT_JOBS, LEASE_S, RENEW_S, beat_leader, machines, only_the_sweeps  # noqa: F401 (fixture)

# About 2 minutes on a 2-core host shared with other test runs: one onboarding, one move, 16 credentials.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(360)]

CREDENTIALS = 16
DONE_AT_KILL = 3  # credentials re-encrypted on machine 1 before it dies
# Machine 1's workers: 0.4 s after each re-encrypted credential, and the move held in its copy step after the copy.
MACHINE_1_PAUSES = {"VAULT_ROTATION_PAUSE_PER_ITEM_S": "0.4", "PROVISIONING_PAUSE_AFTER_EFFECT_S": "120",
                    "PROVISIONING_PAUSE_STEP": "copy"}
DEMO = {"search_s": 0.1, "step_sleep_s": 0.1}


def _leads(machine) -> bool:  # type: ignore[no-untyped-def]
    leader = beat_leader()
    return leader is not None and leader[0].split(":")[1] == str(machine.beat.pid)


def test_machine_1_dies_mid_rotation_and_mid_move_and_machine_2_finishes_both(
        machines, operator, second_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811 (fixtures)
    one, two, _headers = machines
    only_the_sweeps(kept=KEPT_JOBS[:1])  # the stall sweep, every 2 s
    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    one.start_beat()
    wait_for(lambda: _leads(one), timeout=60, what="machine 1's beat leading")
    two.start_web()  # the instances' control-plane URL
    two.start_beat()
    one.start_worker(**MACHINE_1_PAUSES)
    one.start_worker(**MACHINE_1_PAUSES)

    # The tenant to move: onboarded by machine 1, with a finished task's rows in its schema on the default server.
    mover = onboard_ready(operator, f"mover-{secrets.token_hex(2)}")
    instance_submit_task(tenant=mover, kind="demo", params=DEMO, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=mover)["tasks"].get("done") == 1, timeout=90, what="task done")
    # The tenant whose key rotates: credentials only (the vault is the control plane's, no instance needed).
    rotating = make_tenant(operator)
    values = {f"cred-{i}": f"secret-{secrets.token_hex(8)}" for i in range(CREDENTIALS)}
    for name, value in values.items():
        credential_put(tenant=rotating, name=name, value=value, actor=SYSTEM)

    # Machine 1 mid-move (held in copy, the copy loaded on the target) and mid-rotation (a few credentials done).
    expected = _durable("default", mover)
    move = database_move_start(tenant=mover, target="second", actor=SYSTEM)
    wait_for(lambda: WorkflowStep.objects.filter(run_id=move.run_id, name="copy", status="running").exists(),
             timeout=90, what="the move's copy running on machine 1")
    wait_for(lambda: _loaded("second", mover), timeout=60, what="the copy loaded on the target")
    job = data_key_rotate_start(tenant=rotating, actor=SYSTEM)
    assert job.total == CREDENTIALS and job.target == "2"
    wait_for(lambda: RotationJob.objects.get(pk=job.pk).done >= DONE_AT_KILL, timeout=90, interval=0.05,
             what="the rotation under way on machine 1")
    leader_before = beat_leader()
    assert leader_before is not None and _leads(one)
    one.kill()
    killed_at = time.monotonic()

    # Really mid-job: the rotation half done, the move's copy done but unrecorded, the tenant still on the source.
    job.refresh_from_db()
    assert job.status == "running" and DONE_AT_KILL <= job.done < job.total, (job.status, job.done)
    done_at_kill = job.done
    rewrapped = {pk: bytes(c) for pk, c in CredentialVersion.objects.filter(
        credential__tenant=rotating, data_key_version=2).values_list("pk", "ciphertext")}
    assert len(rewrapped) == done_at_kill
    steps_at_kill = dict(WorkflowStep.objects.filter(run_id=move.run_id).values_list("name", "status"))
    assert steps_at_kill["drain"] == "done" and steps_at_kill["copy"] == "running", steps_at_kill
    assert tenant_database_server(mover).name == "default"

    # Machine 2 carries on: its beat leads within the lease period, its worker picks up what the sweep queues.
    worker = two.start_worker()
    wait_for(lambda: _leads(two), timeout=30, interval=0.05, what="machine 2's beat leading")
    takeover_s = time.monotonic() - killed_at
    leader_after = beat_leader()
    assert leader_after is not None and leader_after[1] > leader_before[1]
    assert takeover_s <= LEASE_S + RENEW_S + 4.0, takeover_s
    wait_for(lambda: RotationJob.objects.get(pk=job.pk).status not in ("pending", "running"), timeout=120,
             what="the rotation finished on machine 2")
    rotated_s = time.monotonic() - killed_at
    wait_for(lambda: WorkflowRun.objects.get(pk=move.run_id).status in ("succeeded", "failed"), timeout=120,
             what="the move finished on machine 2")
    moved_s = time.monotonic() - killed_at

    # The rotation: resumed by machine 2 where machine 1 stopped; each credential re-encrypted exactly once.
    job.refresh_from_db()
    assert job.status == "succeeded", (job.error, worker.log()[-3000:])
    assert job.done == job.total == CREDENTIALS  # one count per re-encryption, committed with it
    assert f"rotation job {job.pk} (data_key) resuming at {done_at_kill}/{CREDENTIALS}" in worker.log()
    after = dict(CredentialVersion.objects.filter(credential__tenant=rotating).values_list("pk", "ciphertext"))
    assert set(CredentialVersion.objects.filter(credential__tenant=rotating)
               .values_list("data_key_version", flat=True)) == {2}
    assert all(bytes(after[pk]) == ciphertext for pk, ciphertext in rewrapped.items())  # not sealed again
    keys = TenantDataKey.objects.filter(tenant=rotating, purpose="credentials").order_by("version")
    assert [(k.version, k.status) for k in keys] == [(1, "retired"), (2, "active")]
    for name, value in values.items():
        assert credential_reveal(tenant=rotating, name=name, actor=SYSTEM, audit=False) == value

    # The move: only the step in flight at the kill ran twice; the rows carried over exactly; the source dropped.
    run = WorkflowRun.objects.get(pk=move.run_id)
    assert run.status == "succeeded", (run.error, worker.log()[-3000:])
    attempts = dict(WorkflowStep.objects.filter(run=run).values_list("name", "attempts"))
    assert attempts == {"drain": 1, "copy": 2, "verify": 1, "switch": 1, "resume": 1, "drop_source": 1}, attempts
    assert tenant_database_server(mover).name == "second"
    assert _durable("second", mover) == expected
    assert not _schema_on("default", mover)
    # Its instance, started again by machine 2's worker, works on the new server.
    assert AgentInstance.objects.get(tenant=mover).status == "running"
    instance_submit_task(tenant=mover, kind="demo", params=DEMO, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=mover)["tasks"].get("done") == 2, timeout=90,
             what="a new task done on the new server")
    done = _rows("second", mover, "SELECT task_id, step, count(*) FROM {s}.step_events WHERE event = 'done'"
                                  " GROUP BY task_id, step")
    assert len({task for task, _step, _n in done}) == 2 and all(n == 1 for _t, _s, n in done), done
    print(f"\ntwo machines, jobs: machine 1 killed at {done_at_kill}/{CREDENTIALS} credentials and in the move's "
          f"copy; beat lease taken over in {takeover_s:.2f} s (lease {LEASE_S:g} s, renew {RENEW_S:g} s); "
          f"rotation finished {rotated_s:.1f} s and move {moved_s:.1f} s after the kill (stall after 5 s, "
          f"sweep every 2 s)")
