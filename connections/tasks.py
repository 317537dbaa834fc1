"""Celery tasks of the connections app: thin, each one service call."""

from __future__ import annotations

from celery import shared_task

from .services import connections_refresh_due

__all__ = ["connections_refresh_sweep_task"]


@shared_task(acks_late=True)
def connections_refresh_sweep_task() -> dict[str, int]:
    """The beat job: connections expiring within ``OAUTH_REFRESH_SWEEP_WINDOW_S`` refreshed. Overlapping runs are
    safe: each connection's refresh is single-flight (the second run counts it ``in_flight``)."""
    return connections_refresh_due()
