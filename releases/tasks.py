"""Celery tasks for releases: ids in, one service call. A killed worker's rollout is queued again by beat."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from provisioning.tenant_actions import actor_from_dict
from tenants.actors import SYSTEM

from .rollouts import rollout_execute, rollout_resume_stalled

__all__ = ["run_release_rollout", "resume_stalled_release_rollouts"]


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=5)
def run_release_rollout(self, rollout_id: str, actor: dict[str, Any] | None = None) -> str:  # type: ignore[no-untyped-def]
    """Execute or resume a rollout; per-tenant failures are the gate's business, not retried here."""
    try:
        return rollout_execute(rollout_id, actor_from_dict(actor) if actor else SYSTEM)
    except Exception as exc:  # noqa: BLE001 - database gone and the like: retry with backoff
        raise self.retry(countdown=2 ** self.request.retries, exc=RuntimeError(type(exc).__name__)) from None


@shared_task(acks_late=True)
def resume_stalled_release_rollouts() -> int:
    return rollout_resume_stalled()
