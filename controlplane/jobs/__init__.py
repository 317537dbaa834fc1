"""The job kernel: one engine for every resumable job of the control plane (issue 36).

Five machines grew the same parts, each its own copy. Read side by side, they share:

- **steps or waves**: ``provisioning/workflows/engine.py`` runs a run's ``WorkflowStep`` rows in order (onboard,
  deprovision, recover, move); ``vault/rotation.py`` walks key or credential rows in id order behind a cursor,
  then retires old keys; ``branding/services.py`` walks an operator's instances in id order behind a cursor;
  ``provisioning/fleet/rolling.py`` restarts instances ``concurrency`` at a time; ``releases/rollouts.py`` upgrades a
  canary then waves of tenants, each soaked under a health gate. The last three are "waves across the fleet",
  now one planner and driver (``waves.py``).
- **a lease**: a PostgreSQL session advisory lock per job, so one worker drives it; the server drops it when a
  SIGKILLed worker's connection goes, so a dead driver never blocks the next one;
- **progress**: committed after every unit of work (a step's status, a cursor and counters, an item's
  status) together with ``updated_at``, so a resumed driver starts where the killed one stopped and each unit
  is an ``ensure`` that is harmless to redo;
- **resume after a stall**: a beat sweep re-queues every unfinished job whose ``updated_at`` has not moved for a
  stall time (its worker may be gone; a duplicate is a no-op because of the lease);
- **a pause for tests only**: a fault-injection knob that sleeps at the worst moment so a chaos test can
  SIGKILL the worker there, refused unless ``CONTROLPLANE_FAULT_INJECTION`` is on (and always in production);
- **a Celery task** (``acks_late``, ``reject_on_worker_lost``, retried with backoff on unexpected errors).

What the kernel gives (``kernel.py``): a declared ``JobKind`` (its table, which statuses are unfinished, its
body, stall time, pause knob), ``job_start`` (queue a drive once the job's row is committed), ``job_drive``
(take the lease, mark the job running, run the body), ``job_progress`` (commit a unit's progress with the
heartbeat), ``jobs_resume_stalled`` (the one sweep for every kind; ``JOBS_STALL_AFTER_S`` with a per-kind
override), ``job_pause`` (the test-only pause), ``RetryLater`` (a body's "try this unit again in n seconds") and
``cursor_batches`` (walk a table in batches behind a cursor).
``waves.py`` is the one "waves across the fleet" rollout on top of it: ``WavePlan`` and ``canary_size`` plan
the waves, ``waves_drive`` applies a ``WaveFleet`` wave by wave under its health gate; restarts, branding and
release rollouts are fleets of it.
``tasks.py`` holds the one drive task and the one sweep task (declared in ``controlplane/periodic.py``).

What it does not do: it owns no table (each kind keeps its model and statuses, so public answers and audit rows
stay the machine's own), it knows no higher app (kinds register themselves from their app), and it decides
nothing about a job's domain (supersession, rollback, gates stay in the kind's body).
"""

from __future__ import annotations

from .kernel import (
    JobKind,
    Outcome,
    RetryLater,
    cursor_batches,
    job_drive,
    job_kind,
    job_kind_register,
    job_kind_unregister,
    job_kinds,
    job_pause,
    job_progress,
    job_stall_after_s,
    job_start,
    jobs_resume_stalled,
)
from .waves import WaveEnd, WaveFleet, WavePlan, WavesResult, canary_size, waves_drive

__all__ = [
    "JobKind",
    "Outcome",
    "RetryLater",
    "WaveEnd",
    "WaveFleet",
    "WavePlan",
    "WavesResult",
    "canary_size",
    "cursor_batches",
    "job_drive",
    "job_kind",
    "job_kind_register",
    "job_kind_unregister",
    "job_kinds",
    "job_pause",
    "job_progress",
    "job_start",
    "job_stall_after_s",
    "jobs_resume_stalled",
    "waves_drive",
]
