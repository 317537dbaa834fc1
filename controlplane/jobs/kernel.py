"""The kernel's parts: declared job kinds, the lease, progress, the stall sweep, the test-only pause, cursor walks.

A job is a row of its kind's own model with a ``status`` and an ``updated_at`` (and, optionally, a
``started_at``). The kernel reads and writes only those fields; everything else on the row (cursor, counters,
details) is the kind's, written through ``job_progress`` so that every unit of progress also moves
``updated_at``, the heartbeat the sweep reads. No HTTP and no higher app here: kinds register themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.config_table import FAULT_INJECTION_SWITCH
from controlplane.locks import AdvisoryLock

__all__ = [
    "JobKind",
    "Outcome",
    "RetryLater",
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
]

log = logging.getLogger(__name__)

T = TypeVar("T")
C = TypeVar("C")


class Outcome:
    """What ``job_drive`` answers when it did not run the body (the body's own answer otherwise)."""

    BUSY = "busy"  # another driver holds the job's lease
    FINISHED = "finished"  # the job is not unfinished any more: nothing to do
    MISSING = "missing"  # no such row (deleted with its tenant or operator): nothing to retry


@dataclass
class RetryLater(Exception):
    """Raised by a body whose unit failed and should be tried again after ``countdown`` seconds (the drive task
    re-queues it; the body bounds the attempts in its own rows, so the task does not count them)."""

    countdown: float
    reason: str


@dataclass(frozen=True)
class JobKind:
    """One kind of resumable job, declared once by the app that owns it.

    ``model``: the table of this kind's jobs (each row has ``status`` and ``updated_at``).
    ``active_statuses``: the unfinished statuses: a driver works on them and the sweep resumes them.
    ``run``: the body, given the job's id (and the JSON ``params`` its start passed, none from the sweep) once the
    lease is held and the job marked running; it resumes from the progress the row records and answers the job's
    outcome (usually its final status).
    ``running_status``: what the job is marked when a driver takes it (empty: left as it is).
    ``marks_started``: also set ``started_at`` the first time a driver takes it.
    ``stall_after_s``: seconds without progress before the sweep queues it again; a number, the name of a per-kind
    setting, or None for ``JOBS_STALL_AFTER_S``.
    ``pause_setting``: the fault-injection knob (seconds) ``job_pause`` sleeps; ``pause_step_setting``: the knob
    naming the one step to pause at (empty value: every step).
    """

    name: str
    model: type[models.Model]
    active_statuses: tuple[str, ...]
    run: Callable[..., str]
    running_status: str = "running"
    marks_started: bool = True
    stall_after_s: float | str | None = None
    pause_setting: str = ""
    pause_step_setting: str = ""

    def lease_name(self, job_id: object) -> str:
        return f"job:{self.name}:{job_id}"


_KINDS: dict[str, JobKind] = {}


def job_kind_register(kind: JobKind) -> JobKind:
    """Declare ``kind`` (from the owning app's module, imported by its ``AppConfig.ready``); answers it."""
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ImproperlyConfigured(f"two job kinds are named {kind.name!r}")
    _KINDS[kind.name] = kind
    return kind


def job_kind_unregister(name: str) -> None:
    """Forget a kind (tests that declare their own)."""
    _KINDS.pop(name, None)


def job_kind(name: str) -> JobKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise ImproperlyConfigured(f"no job kind is named {name!r}; is its app installed?") from None


def job_kinds() -> list[JobKind]:
    return list(_KINDS.values())


def _kind(kind: JobKind | str) -> JobKind:
    return job_kind(kind) if isinstance(kind, str) else kind


def _jobs(kind: JobKind) -> models.QuerySet[Any]:
    return kind.model._default_manager.all()


def job_start(kind: JobKind | str, job_id: object, *, params: Mapping[str, Any] | None = None) -> None:
    """Queue a drive of the job once the current transaction commits (a task never runs before its row).

    ``params`` (JSON) reach this drive's body only, e.g. who asked for it; a drive from the sweep gets none.
    """
    from .tasks import job_drive_task  # the task module imports this one

    name, key, extra = _kind(kind).name, str(job_id), dict(params or {})
    transaction.on_commit(lambda: job_drive_task.delay(name, key, extra))


def job_drive(kind: JobKind | str, job_id: object, params: Mapping[str, Any] | None = None) -> str:
    """Drive the job if no one else does: take its lease, mark it running, run the kind's body.

    Safe to call any number of times from any worker: a second driver answers ``busy`` at once, a finished job
    ``finished``, a deleted one ``missing``. The lease is a PostgreSQL session advisory lock, released by the
    server when a killed driver's connection drops, so the next drive (a redelivered task, the sweep) takes over.
    """
    kind = _kind(kind)
    with AdvisoryLock(kind.lease_name(job_id)) as lease:
        if not lease.held:
            return Outcome.BUSY
        status = _jobs(kind).filter(pk=job_id).values_list("status", flat=True).first()
        if status is None:
            return Outcome.MISSING
        if status not in kind.active_statuses:
            return Outcome.FINISHED
        if kind.running_status:
            now = timezone.now()
            fields: dict[str, Any] = {"status": kind.running_status, "updated_at": now}
            if kind.marks_started:
                fields["started_at"] = Coalesce(F("started_at"), Value(now))
            # Only while still unfinished: a job finished meanwhile by someone else (superseded, cancelled) stays so.
            if not _jobs(kind).filter(pk=job_id, status__in=kind.active_statuses).update(**fields):
                return Outcome.FINISHED
        return kind.run(str(job_id), **(params or {}))


def job_progress(kind: JobKind | str, job_id: object, *, values: Mapping[str, Any] | None = None,
                 add: Mapping[str, int] | None = None) -> None:
    """Commit a unit of progress: set ``values``, add to the counters in ``add``, and move ``updated_at``.

    With neither, a heartbeat: the job is alive (a long soak, a slow instance) and the sweep leaves it alone.
    Call it inside the transaction that does the unit's work, so the work and its record commit together.
    """
    fields: dict[str, Any] = {"updated_at": timezone.now(), **(values or {})}
    fields.update({name: F(name) + amount for name, amount in (add or {}).items()})
    _jobs(_kind(kind)).filter(pk=job_id).update(**fields)


def job_stall_after_s(kind: JobKind | str) -> float:
    """Seconds without progress after which the sweep resumes a job of this kind."""
    stall = _kind(kind).stall_after_s
    if stall is None:
        return float(settings.JOBS_STALL_AFTER_S)
    return float(getattr(settings, stall)) if isinstance(stall, str) else float(stall)


def jobs_resume_stalled(kinds: Iterable[JobKind | str] | None = None) -> int:
    """Queue a drive of every unfinished job that has not moved for its kind's stall time; the number queued.

    One sweep for every kind (beat runs it). A job whose driver is alive but slow is harmless to queue: its
    lease turns the extra drive into ``busy``.
    """
    from .tasks import job_drive_task

    queued = 0
    now = timezone.now()
    for kind in [_kind(k) for k in kinds] if kinds is not None else job_kinds():
        cutoff = now - timedelta(seconds=job_stall_after_s(kind))
        stalled = list(_jobs(kind).filter(status__in=kind.active_statuses, updated_at__lt=cutoff)
                       .values_list("pk", flat=True))
        for job_id in stalled:
            job_drive_task.delay(kind.name, str(job_id))
        if stalled:
            log.info("resuming %s stalled %s job(s)", len(stalled), kind.name)
        queued += len(stalled)
    return queued


def job_pause(kind: JobKind | str, *, step: str = "") -> None:
    """The test-only pause: sleep the kind's fault-injection knob here so a chaos test can SIGKILL the driver.

    Nothing unless the knob is set (and, with a step knob, names ``step`` or is empty). A set knob without the
    fault-injection switch, or in production, is refused here too, not only when settings load: a knob slipped
    into a running process (``override_settings``, a shell) must not stall real jobs.
    """
    kind = _kind(kind)
    if not kind.pause_setting:
        return
    seconds = float(getattr(settings, kind.pause_setting, 0) or 0)
    if not seconds:
        return
    if kind.pause_step_setting and getattr(settings, kind.pause_step_setting, "") not in ("", step):
        return
    if settings.PRODUCTION or not settings.CONTROLPLANE_FAULT_INJECTION:
        raise ImproperlyConfigured(f"{kind.pause_setting} is a fault-injection setting: it needs "
                                   f"{FAULT_INJECTION_SWITCH}=1 and is refused in production (tests only)")
    time.sleep(seconds)


def cursor_batches(fetch: Callable[[C | None], Sequence[T]], *, cursor: C | None,
                   key: Callable[[T], C]) -> Iterator[T]:
    """Walk a table in batches behind a cursor: ``fetch(after)`` answers the next batch after ``after`` (None: from
    the start), in the order the cursor follows; items are yielded one by one and the walk ends on an empty batch.
    (Rollouts across the fleet use ``waves.waves_drive`` instead: waves, a gate, a stop on failure.)

    The caller records each item's progress (``job_progress`` with the item's key as the cursor) before the
    next one, so a resumed driver starts its walk at the recorded cursor and never revisits what it finished.
    """
    while True:
        batch = list(fetch(cursor))
        if not batch:
            return
        for item in batch:
            yield item
            cursor = key(item)
