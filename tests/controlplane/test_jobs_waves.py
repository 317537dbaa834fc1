"""The one "waves across the fleet" rollout (controlplane/jobs/waves.py): its planner and its driver.

The planner is pure: wave sizing with and without a canary, short fleets, percentages. The driver runs under a
real job kind on a real PostgreSQL row (its heartbeat is the kernel's ``job_progress``, its lease ``job_drive``)
with a fleet of our own whose state plays the part of a rollout's committed rows: a health gate that fails
stops the next wave, a failed target stops the rollout after its wave, a stop between batches is honoured, and a
driver killed mid-wave is resumed by a second drive at the right wave without redoing what was done. The three
rollouts that are fleets of it (releases, rolling restarts, branding) keep their own end-to-end tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from controlplane.jobs import JobKind, job_drive, job_kind_register, job_kind_unregister
from controlplane.jobs.waves import WaveEnd, WaveFleet, WavePlan, canary_size, waves_drive
from vault.models import RotationJob

# --- the planner (pure) -------------------------------------------------------------------------------------


def test_waves_without_a_canary_are_all_the_same_size():
    plan = WavePlan(size=3)
    assert plan.waves(7) == [0, 0, 0, 1, 1, 1, 2]  # the last wave is what is left
    assert plan.waves(6) == [0, 0, 0, 1, 1, 1]
    assert plan.waves(0) == []
    assert WavePlan(size=1).waves(3) == [0, 1, 2]


def test_a_canary_is_the_first_wave_and_the_rest_follow_in_waves_of_the_size():
    assert WavePlan(size=2, first=2).waves(6) == [0, 0, 1, 1, 2, 2]  # what a release rollout stores
    assert WavePlan(size=3, first=1).waves(5) == [0, 1, 1, 1, 2]
    assert WavePlan(size=2, first=5).waves(3) == [0, 0, 0]  # a fleet smaller than the canary: one wave
    assert WavePlan(size=10, first=1).waves(1) == [0]


@pytest.mark.parametrize("plan", [WavePlan(size=3), WavePlan(size=2, first=1), WavePlan(size=4, first=7)])
def test_positions_are_exactly_the_targets_of_a_wave(plan):
    total = 20
    waves = plan.waves(total)
    for wave in range(max(waves) + 1):
        assert [p for p in plan.positions(wave) if p < total] == [p for p in range(total) if waves[p] == wave]


def test_a_plan_refuses_empty_waves_and_negative_places():
    for bad in (lambda: WavePlan(size=0), lambda: WavePlan(size=2, first=0), lambda: WavePlan(size=2).wave_of(-1),
                lambda: WavePlan(size=2).positions(-1)):
        with pytest.raises(ValueError):
            bad()


def test_canary_size_from_a_count_a_percentage_or_the_default():
    assert canary_size(8, default=1) == 1
    assert canary_size(8, count=3, default=1) == 3
    assert canary_size(8, percent=10, default=5) == 1  # 0.8 rounds up: at least one target
    assert canary_size(7, percent=50, default=1) == 4
    assert canary_size(7, percent=100, default=1) == 7
    assert canary_size(0, percent=50, default=1) == 1
    with pytest.raises(ValueError):
        canary_size(8, count=2, percent=10, default=1)


# --- the driver ---------------------------------------------------------------------------------------------


class Killed(BaseException):
    """A driver dying mid-target (SIGKILL): not an ``Exception``, so nothing records it as the target's failure."""


class Fleet(WaveFleet[int]):
    """A rollout of our own: ``rows`` plays its committed rows (shared by every drive, like the database)."""

    def __init__(self, rows: dict[str, dict], job: RotationJob, *, plan: WavePlan, concurrency: int = 1,
                 soak_s: float | None = None, unhealthy: Callable[[int], str] = lambda wave: "",
                 failing: set[int] = frozenset(), kill_at: int | None = None,  # type: ignore[assignment]
                 stop_after: int | None = None, threads: bool = True) -> None:
        self.rows, self.plan, self.soak_s = rows, plan, soak_s
        self.job_kind, self.job_id = KIND, str(job.pk)
        self.concurrency, self.threads, self.gate_poll_s = concurrency, threads, 0.05
        self.unhealthy, self.failing, self.kill_at, self.stop_after = unhealthy, failing, kill_at, stop_after
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        if "targets" not in rows:  # the first drive plans the rollout, as its start would
            rows["targets"] = {t: {"wave": w, "status": "pending", "applied": 0, "at": None}
                               for t, w in enumerate(plan.waves(rows.pop("total")))}
            rows["gated"] = []

    @property
    def targets(self) -> dict[int, dict]:
        return self.rows["targets"]

    def applied_waves(self) -> set[int]:
        return {row["wave"] for row in self.targets.values() if row["applied"]}

    def proceeding(self) -> bool:
        return self.stop_after is None or sum(r["applied"] for r in self.targets.values()) < self.stop_after

    def next_wave(self) -> int | None:
        return min((r["wave"] for r in self.targets.values() if r["status"] != "done"), default=None)

    def last_wave(self) -> int | None:
        return max((r["wave"] for r in self.targets.values()), default=None)

    def remaining(self, wave: int, limit: int) -> list[int]:
        return [t for t, r in sorted(self.targets.items())
                if r["wave"] == wave and r["status"] in ("pending", "applying")][:limit]

    def apply(self, target: int) -> None:
        row = self.targets[target]
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            row.update(status="applying", applied=row["applied"] + 1)
            time.sleep(0.05)
            if target == self.kill_at:
                raise Killed()
            if target in self.failing:
                raise RuntimeError(f"target {target} would not take it")
            row.update(status="done", at=timezone.now())
        finally:
            with self.lock:
                self.in_flight -= 1

    def record_failure(self, target: int, error: Exception) -> None:
        self.targets[target].update(status="failed", error=str(error))

    def wave_failure(self, wave: int) -> str:
        failed = [t for t, r in self.targets.items() if r["wave"] == wave and r["status"] == "failed"]
        return f"wave {wave} failed: target {failed[0]}" if failed else ""

    def gate_deadline(self, wave: int) -> datetime | None:
        done = [r["at"] for r in self.targets.values() if r["wave"] == wave and r["at"]]
        return None if self.soak_s is None or not done else max(done) + timedelta(seconds=self.soak_s)

    def gate_problem(self, wave: int) -> str:
        self.rows["gated"].append((wave, timezone.now()))
        return self.unhealthy(wave)


KIND = JobKind(name="waves-test", model=RotationJob, active_statuses=("pending", "running"), run=lambda job_id: "")


@pytest.fixture
def job():  # type: ignore[no-untyped-def]
    job_kind_register(KIND)
    yield RotationJob.objects.create(kind="kek", target="waves-test", total=0)
    job_kind_unregister(KIND.name)


@pytest.mark.django_db
def test_every_wave_is_held_under_the_gate_before_the_next_and_the_last_one_too(job):
    rows: dict[str, dict] = {"total": 5}
    fleet = Fleet(rows, job, plan=WavePlan(size=2, first=1), soak_s=0.3)
    before = RotationJob.objects.get(pk=job.pk).updated_at
    assert waves_drive(fleet).end == WaveEnd.DONE
    targets = fleet.targets
    assert all(r["status"] == "done" and r["applied"] == 1 for r in targets.values())
    assert {w for w, _ in rows["gated"]} == {0, 1, 2}
    for wave in (0, 1):  # the next wave began only once this one had soaked for soak_s
        soaked = max(r["at"] for r in targets.values() if r["wave"] == wave) + timedelta(seconds=0.3)
        next_began = min(r["at"] for r in targets.values() if r["wave"] == wave + 1) - timedelta(seconds=0.05)
        assert next_began >= soaked
    assert RotationJob.objects.get(pk=job.pk).updated_at > before  # the heartbeat the stall sweep reads


@pytest.mark.django_db
def test_a_failed_health_gate_stops_the_next_wave(job):
    rows: dict[str, dict] = {"total": 6}
    fleet = Fleet(rows, job, plan=WavePlan(size=2, first=2), soak_s=0.2,
                  unhealthy=lambda wave: "target 3 crashed" if wave == 1 else "")
    result = waves_drive(fleet)
    assert (result.end, result.reason) == (WaveEnd.FAILED, "target 3 crashed")
    assert fleet.applied_waves() == {0, 1}  # wave 2 never touched
    assert [r["applied"] for r in fleet.targets.values()] == [1, 1, 1, 1, 0, 0]


@pytest.mark.django_db
def test_a_failed_target_stops_the_rollout_after_its_wave(job):
    rows: dict[str, dict] = {"total": 7}
    fleet = Fleet(rows, job, plan=WavePlan(size=3, first=1), failing={1})
    result = waves_drive(fleet)
    assert (result.end, result.reason) == (WaveEnd.FAILED, "wave 1 failed: target 1")
    # The failed target's wave is finished (its other targets applied), the next one is never begun.
    assert [r["status"] for r in fleet.targets.values()] == ["done", "failed", "done", "done", "pending",
                                                              "pending", "pending"]
    # Driven again (a redelivered task): the failed wave is still where it stops; nothing is applied again.
    assert waves_drive(Fleet(rows, job, plan=WavePlan(size=3, first=1))).reason == "wave 1 failed: target 1"
    assert [r["applied"] for r in fleet.targets.values()] == [1, 1, 1, 1, 0, 0, 0]


@pytest.mark.django_db
def test_a_driver_killed_mid_wave_is_resumed_at_that_wave_redoing_only_the_target_in_flight(job):
    rows: dict[str, dict] = {"total": 7}
    plan = WavePlan(size=3, first=1)  # waves [0], [1, 2, 3], [4, 5, 6]
    with pytest.raises(Killed):
        waves_drive(Fleet(rows, job, plan=plan, soak_s=0.1, kill_at=2))
    assert [r["status"] for r in rows["targets"].values()] == ["done", "done", "applying", "pending", "pending",
                                                                 "pending", "pending"]

    gated_before = len(rows["gated"])
    resumed = Fleet(rows, job, plan=plan, soak_s=0.1)
    assert resumed.next_wave() == 1  # read from the rows, not from the dead driver
    assert waves_drive(resumed).end == WaveEnd.DONE
    assert [r["applied"] for r in resumed.targets.values()] == [1, 1, 2, 1, 1, 1, 1]  # only the one in flight twice
    # Wave 0 soaked long ago: its gate is looked at once more, not held again from zero.
    assert [w for w, _ in rows["gated"][gated_before:]].count(0) == 1


@pytest.mark.django_db(transaction=True)
def test_a_drive_under_the_kernel_lease_resumes_the_rollout_where_a_killed_one_stopped():
    rows: dict[str, dict] = {"total": 4}
    plan = WavePlan(size=2)
    drives = iter([{"kill_at": 2}, {}])
    kind = JobKind(name="waves-test-kernel", model=RotationJob, active_statuses=("pending", "running"),
                   run=lambda job_id: waves_drive(Fleet(rows, RotationJob.objects.get(pk=job_id), plan=plan,
                                                        **next(drives))).end)
    job_kind_register(kind)
    try:
        job = RotationJob.objects.create(kind="kek", target="waves-test", total=4)
        with pytest.raises(Killed):
            job_drive(kind, job.pk)
        assert job_drive(kind, job.pk) == WaveEnd.DONE  # the lease went with the dead drive
    finally:
        job_kind_unregister(kind.name)
    assert [r["applied"] for r in rows["targets"].values()] == [1, 1, 2, 1]


@pytest.mark.django_db
def test_a_fleet_that_stops_proceeding_is_stopped_between_batches(job):
    rows: dict[str, dict] = {"total": 6}
    fleet = Fleet(rows, job, plan=WavePlan(size=6), stop_after=2, threads=False)  # e.g. paused after two
    assert waves_drive(fleet).end == WaveEnd.STOPPED
    assert [r["applied"] for r in fleet.targets.values()] == [1, 1, 0, 0, 0, 0]
    fleet.stop_after = None  # resumed
    assert waves_drive(fleet).end == WaveEnd.DONE
    assert [r["applied"] for r in fleet.targets.values()] == [1] * 6


@pytest.mark.django_db
def test_a_wave_is_applied_concurrency_at_a_time_in_threads(job):
    fleet = Fleet({"total": 5}, job, plan=WavePlan(size=5), concurrency=2)
    assert waves_drive(fleet).end == WaveEnd.DONE
    assert fleet.most_in_flight == 2
    inline = Fleet({"total": 5}, job, plan=WavePlan(size=5), concurrency=2, threads=False)
    with pytest.raises(ValueError, match="only in threads"):
        waves_drive(inline)
    assert not inline.applied_waves()


@pytest.mark.django_db
def test_a_fleet_that_raises_from_record_failure_ends_the_drive(job):
    class Strict(Fleet):
        def record_failure(self, target: int, error: Exception) -> None:
            raise error

    fleet = Strict({"total": 3}, job, plan=WavePlan(size=3), failing={1}, threads=False)
    with pytest.raises(RuntimeError, match="target 1"):
        waves_drive(fleet)
    assert [r["applied"] for r in fleet.targets.values()] == [1, 1, 0]


@pytest.mark.django_db
def test_a_fleet_whose_answers_disagree_ends_the_drive_instead_of_spinning(job):
    class Lost(Fleet):  # a target neither done nor failed, yet never answered as left to apply
        def remaining(self, wave: int, limit: int) -> list[int]:
            return [t for t in super().remaining(wave, limit) if t != 1]

    fleet = Lost({"total": 3}, job, plan=WavePlan(size=1), threads=False)
    with pytest.raises(RuntimeError, match="wave 1 has targets not done"):
        waves_drive(fleet)
    assert [r["applied"] for r in fleet.targets.values()] == [1, 0, 0]
