"""Celery tasks for branding: ids in, one service call, retry policy here."""

from __future__ import annotations

from celery import shared_task

from .services import branding_revision_process, rollout_execute, rollout_resume_stalled

__all__ = ["process_branding_revision", "run_rollout", "resume_stalled_rollouts"]


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=5)
def process_branding_revision(self, revision_id: str) -> str:  # type: ignore[no-untyped-def]
    """Validate, sanitize and publish a submission. Validation failures are recorded, not retried."""
    try:
        return branding_revision_process(revision_id)
    except Exception as exc:  # noqa: BLE001 - database gone and the like: retry with backoff
        raise self.retry(countdown=2 ** self.request.retries, exc=RuntimeError(type(exc).__name__)) from None


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=5)
def run_rollout(self, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """Execute or resume a rollout; per-instance failures are recorded on the job, not retried here."""
    try:
        return rollout_execute(job_id)
    except Exception as exc:  # noqa: BLE001
        raise self.retry(countdown=2 ** self.request.retries, exc=RuntimeError(type(exc).__name__)) from None


@shared_task(acks_late=True)
def resume_stalled_rollouts() -> int:
    return rollout_resume_stalled()
