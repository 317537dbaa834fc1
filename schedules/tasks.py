"""Celery task of schedules: the beat sweep (declared in ``controlplane/periodic.py``). No logic here.

No retry policy: a sweep that fails or is killed leaves its work to the next one, a few seconds later, and the
fire rows and inbox keys make running it twice harmless."""

from __future__ import annotations

from celery import shared_task

from .sweep import schedules_sweep

__all__ = ["schedules_sweep_task"]


@shared_task(acks_late=True, ignore_result=True)
def schedules_sweep_task() -> int:
    result = schedules_sweep()
    return result.created + result.dispatched
