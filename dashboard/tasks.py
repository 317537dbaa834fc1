"""Celery tasks of the dashboard: thin, each calls one service."""

from __future__ import annotations

from celery import shared_task

__all__ = ["history_sample_task"]


@shared_task(acks_late=True)
def history_sample_task() -> int:
    """Beat's minute tick: one sample of every instance and of the fleet, then prune past the retention."""
    from .sampling import history_sample

    return history_sample().instances
