"""Celery tasks for the vault: ids in, one service call, retry policy here. Never a value or key."""

from __future__ import annotations

from celery import shared_task

from .rotation import rotation_job_execute, rotation_resume_stalled

__all__ = ["run_rotation_job", "resume_stalled_rotations"]


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=5)
def run_rotation_job(self, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """Execute (or resume) a rotation job. Unexpected errors (database gone) retry with backoff;
    the job's own failures are recorded on the job and not retried."""
    try:
        return rotation_job_execute(job_id)
    except Exception as exc:  # noqa: BLE001 - retried; the class name is all that is logged
        raise self.retry(countdown=2 ** self.request.retries, exc=RuntimeError(type(exc).__name__)) from None


@shared_task(acks_late=True)
def resume_stalled_rotations() -> int:
    return rotation_resume_stalled()

