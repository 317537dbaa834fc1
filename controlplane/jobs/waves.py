"""Waves across the fleet: the one planner and the one driver of every rollout that applies something to many
tenants (rolling restarts, branding rollouts, release rollouts and a release rollout's rollback).

**Planning** (pure, no I/O): ``WavePlan`` numbers an ordered list of targets into waves 0, 1, 2, ...: a first wave
of ``first`` targets (a canary; by default as large as the others), then waves of ``size``. ``canary_size`` turns
an operator's "canary: n" or "canary: p %" into that first wave. Waves are numbered without gaps, so the wave
before ``w`` is ``w - 1``.

**Driving** (``waves_drive``): wave after wave, in order,

1. the wave before it is held under the rollout's health gate (if it has one) until its soak deadline, which
   the rollout derives from its committed rows, so a resumed driver soaks only what is left;
2. the wave's remaining targets are applied ``concurrency`` at a time (each in a worker thread with its own
   database connection, unless the fleet applies inline); a target that raises is handed to the fleet's
   ``record_failure``; after each batch the kernel's heartbeat (``job_progress``) and test-only pause
   (``job_pause``) run;
3. after the wave, the fleet says whether a failed target stops the rollout;

and after the last wave that wave is held under the gate too. Between batches and between gate polls the
driver asks the fleet whether it is still ``proceeding`` (paused, aborted, superseded: it answers ``STOPPED``).

Every question the driver asks is answered from the rollout's committed rows, never from the driver's memory,
which is what makes a drive resumable: a driver killed anywhere is replaced (the kernel's lease and stall sweep)
by one that asks the same questions and continues at the right wave, redoing at most the targets that were in
flight (each ``apply`` is an ensure).

What it does not do: it owns no table and writes no row of its own (each rollout keeps its items, statuses,
counters and audit actions, and records each target's outcome itself); it holds no lease (call it from a job
kind's body, under ``job_drive``); it decides nothing about what a failure means (rolling back, marking the
rollout failed, carrying on) beyond stopping the waves.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from django.db import close_old_connections, connection
from django.utils import timezone

from .kernel import JobKind, job_pause, job_progress

__all__ = ["WaveEnd", "WaveFleet", "WavePlan", "WavesResult", "canary_size", "waves_drive"]

T = TypeVar("T")


@dataclass(frozen=True)
class WavePlan:
    """Which wave each of an ordered fleet's targets is in: ``first`` targets in wave 0, then ``size`` per wave.

    ``first`` None: the first wave is as large as the others (no canary).
    """

    size: int
    first: int | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a wave holds at least one target")
        if self.first is not None and self.first < 1:
            raise ValueError("a first wave holds at least one target")

    @property
    def first_size(self) -> int:
        return self.size if self.first is None else self.first

    def wave_of(self, position: int) -> int:
        """The wave of the target at ``position`` (0-based) in the fleet's order."""
        if position < 0:
            raise ValueError("positions start at 0")
        if position < self.first_size:
            return 0
        return 1 + (position - self.first_size) // self.size

    def positions(self, wave: int) -> range:
        """The positions of ``wave``'s targets (past the end of a short fleet: the caller's slice stops there)."""
        if wave < 0:
            raise ValueError("waves start at 0")
        if wave == 0:
            return range(0, self.first_size)
        start = self.first_size + (wave - 1) * self.size
        return range(start, start + self.size)

    def waves(self, total: int) -> list[int]:
        """The wave of each of ``total`` targets, in order (what a rollout stores on its items when it plans)."""
        return [self.wave_of(position) for position in range(total)]


def canary_size(total: int, *, count: int | None = None, percent: float | None = None, default: int) -> int:
    """The first wave's size: ``percent`` of ``total`` rounded up and at least one target, else ``count``, else
    ``default``. (With no targets a percentage still answers one: the plan is empty either way.)"""
    if count is not None and percent is not None:
        raise ValueError("give a count or a percentage, not both")
    if percent is not None:
        return max(1, math.ceil(total * percent / 100))
    return count if count is not None else default


class WaveEnd:
    """How a drive ended."""

    DONE = "done"  # every wave applied (and, with a gate, held healthy to its deadline)
    STOPPED = "stopped"  # the fleet stopped proceeding (paused, aborted, superseded): it reads its own status
    FAILED = "failed"  # a wave failed, by a target or under the gate: ``reason`` says why; nothing later is touched


@dataclass(frozen=True)
class WavesResult:
    end: str
    reason: str = ""


_DONE = WavesResult(WaveEnd.DONE)
_STOPPED = WavesResult(WaveEnd.STOPPED)


class WaveFleet(ABC, Generic[T]):
    """What one rollout tells the driver: its targets, how to apply one, when to stop, and its gate.

    Every answer must come from the rollout's committed rows (see the module docstring). A target is whatever
    the rollout's ``apply`` takes, usually an item's id. Without overriding the gate methods there is no gate.
    """

    #: the job kind and id the drive runs under: its heartbeat and test-only pause
    job_kind: JobKind | str
    job_id: str
    #: targets applied at once (each batch); more than one needs ``threads``
    concurrency: int = 1
    #: apply each target in a worker thread with its own database connection, so the lease's connection is never
    #: touched by a target's work; False: inline, inside the caller's connection (and its transaction)
    threads: bool = True
    #: seconds between two looks of the gate at a soaking wave
    gate_poll_s: float = 2.0

    @abstractmethod
    def next_wave(self) -> int | None:
        """The lowest wave with a target not done yet (a failed one counts: its wave is where the rollout stops);
        None when every target is done."""

    @abstractmethod
    def remaining(self, wave: int, limit: int) -> Sequence[T]:
        """Up to ``limit`` targets of ``wave`` still to apply, in order; one left in flight by a killed driver
        included (``apply`` is an ensure). Empty: the wave is applied."""

    @abstractmethod
    def apply(self, target: T) -> None:
        """Apply the rollout to one target and record its outcome on the target's row."""

    @abstractmethod
    def record_failure(self, target: T, error: Exception) -> None:
        """Record that ``apply`` raised ``error`` (so ``remaining`` no longer answers the target); raise to end the
        drive instead (the kernel's task retries it)."""

    def wave_failure(self, wave: int) -> str:
        """After ``wave`` is applied: why it stops the rollout ("": it does not, failed targets are only counted)."""
        return ""

    def proceeding(self) -> bool:
        """Whether to go on; asked before every batch and every gate poll."""
        return True

    def last_wave(self) -> int | None:
        """The last wave there is (its gate is held after it is applied); only asked of a fleet with a gate."""
        return None

    def gate_deadline(self, wave: int) -> datetime | None:
        """When the applied ``wave`` has soaked long enough; None: nothing to hold (no gate, or nothing applied)."""
        return None

    def gate_problem(self, wave: int) -> str:
        """Why ``wave`` fails the health gate now ("" healthy); record it on the failing target before answering."""
        return ""

    def gate_passed(self, wave: int) -> None:
        """``wave`` stayed healthy to its deadline (e.g. measure what only a finished soak can tell)."""


def waves_drive(fleet: WaveFleet[T]) -> WavesResult:
    """Drive (or resume) ``fleet`` wave by wave until every wave is done, it stops proceeding, or a wave fails."""
    if fleet.concurrency < 1 or (fleet.concurrency > 1 and not fleet.threads):
        raise ValueError("a fleet applies at least one target at a time, and more than one only in threads")
    idle_wave: int | None = None  # a wave just found with nothing to apply and no failure
    while True:
        if not fleet.proceeding():
            return _STOPPED
        wave = fleet.next_wave()
        if wave is not None and wave == idle_wave:
            # The fleet's answers disagree (a target neither done, failed, nor left to apply): spinning on it
            # would hold the lease for ever; the error ends the drive and the kernel's task retries it.
            raise RuntimeError(f"wave {wave} has targets not done, but none to apply and no failure")
        held = fleet.last_wave() if wave is None else wave - 1
        if held is not None and held >= 0:
            verdict = _hold(fleet, held)
            if verdict is not None:
                return verdict
        if wave is None:
            return _DONE if fleet.proceeding() else _STOPPED
        verdict, applied = _apply_wave(fleet, wave)
        if verdict is not None:
            return verdict
        idle_wave = None if applied else wave


def _apply_wave(fleet: WaveFleet[T], wave: int) -> tuple[WavesResult | None, int]:
    """Apply the wave's remaining targets, batch by batch; the verdict (None: go on) and how many were applied."""
    applied = 0
    while True:
        if not fleet.proceeding():
            return _STOPPED, applied
        batch = list(fleet.remaining(wave, fleet.concurrency))
        if not batch:
            break
        applied += len(batch)
        if fleet.threads:
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                list(pool.map(lambda target: _apply_in_thread(fleet, target), batch))
        else:
            for target in batch:
                _apply_one(fleet, target)
        job_progress(fleet.job_kind, fleet.job_id)  # the heartbeat the stall sweep reads
        job_pause(fleet.job_kind)  # chaos tests SIGKILL the driver here
    reason = fleet.wave_failure(wave)
    return (WavesResult(WaveEnd.FAILED, reason) if reason else None), applied


def _apply_one(fleet: WaveFleet[T], target: T) -> None:
    try:
        fleet.apply(target)
    except Exception as exc:  # noqa: BLE001 - the fleet records it on the target (or re-raises)
        fleet.record_failure(target, exc)


def _apply_in_thread(fleet: WaveFleet[T], target: T) -> None:
    close_old_connections()
    try:
        _apply_one(fleet, target)
    finally:
        connection.close()  # the thread's own connection; the lease's stays with the driver's thread


def _hold(fleet: WaveFleet[T], wave: int) -> WavesResult | None:
    """Hold an applied wave under the gate until its deadline; a problem fails it, a stop stops it."""
    deadline = fleet.gate_deadline(wave)
    if deadline is None:
        return None
    while True:
        if not fleet.proceeding():
            return _STOPPED
        problem = fleet.gate_problem(wave)
        if problem:
            return WavesResult(WaveEnd.FAILED, problem)
        job_progress(fleet.job_kind, fleet.job_id)
        now = timezone.now()
        if now >= deadline:
            break
        time.sleep(min(fleet.gate_poll_s, max((deadline - now).total_seconds(), 0.05)))
    fleet.gate_passed(wave)
    return None
