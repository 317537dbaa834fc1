"""Celery tasks for provisioning: ids in, one service call, retry policy here."""

from __future__ import annotations

from celery import shared_task

from .engine import RetryLater, workflow_execute
from .services import workflow_resume_stalled

__all__ = ["run_workflow", "resume_stalled_workflows", "recovery_sweep_task", "drift_check_task",
           "heartbeats_sync_task", "schema_backups_task", "rolling_restart_task"]


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


@shared_task(acks_late=True)
def recovery_sweep_task() -> int:
    from .recovery import recovery_sweep

    return len(recovery_sweep().dispatched)


@shared_task(acks_late=True)
def drift_check_task() -> int:
    from .recovery import drift_check

    return len(drift_check())


@shared_task(acks_late=True)
def heartbeats_sync_task() -> int:
    from .heartbeats import heartbeats_sync

    return heartbeats_sync()


@shared_task(acks_late=True)
def schema_backups_task() -> int:
    from .backups import schema_backups_run

    return schema_backups_run()


@shared_task(acks_late=True, reject_on_worker_lost=True)
def rolling_restart_task(rollout_id: int) -> str:
    from .rolling import rolling_restart_execute

    return rolling_restart_execute(rollout_id)
