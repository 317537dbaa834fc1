"""Celery tasks for provisioning: ids in, one service call, retry policy here."""

from __future__ import annotations

from celery import shared_task

from .engine import RetryLater, workflow_execute
from .services import workflow_resume_stalled

__all__ = ["run_workflow", "resume_stalled_workflows"]


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def run_workflow(self, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """Execute a workflow run. Attempts are bounded per step in the database, not here."""
    try:
        return workflow_execute(run_id)
    except RetryLater as retry:
        raise self.retry(countdown=retry.countdown) from None


@shared_task(acks_late=True)
def resume_stalled_workflows() -> int:
    return workflow_resume_stalled()
