"""Celery tasks of the job kernel: the one drive task for every kind, and the one stall sweep beat runs.

Thin, like every task here: a kind's name and a job id in, one kernel call. The retry policy lives here.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from .kernel import RetryLater, job_drive, jobs_resume_stalled

__all__ = ["job_drive_task", "jobs_resume_stalled_task"]

_MAX_UNEXPECTED_RETRIES = 5


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def job_drive_task(self: Task, kind: str, job_id: str, params: dict[str, Any] | None = None) -> str:
    """Drive (or resume) one job. A body's ``RetryLater`` re-queues it after its countdown (the body counts the
    attempts in the database); unexpected errors (database gone) retry with backoff a few times, then the stall
    sweep takes over. A job's own failures are recorded on the job by its body and not retried. Only the error's
    class name is logged: no secret leaks."""
    try:
        return job_drive(kind, job_id, params)
    except RetryLater as later:
        raise self.retry(countdown=later.countdown) from None
    except Exception as exc:  # noqa: BLE001 - retried; the class name is all that is logged
        if self.request.retries >= _MAX_UNEXPECTED_RETRIES:
            raise RuntimeError(type(exc).__name__) from None
        raise self.retry(countdown=2 ** self.request.retries, exc=RuntimeError(type(exc).__name__)) from None


@shared_task(acks_late=True)
def jobs_resume_stalled_task() -> int:
    return jobs_resume_stalled()
