"""Celery interface of usage: the beat job ("Usage: collect from every instance", ``controlplane/periodic.py``)."""

from __future__ import annotations

from celery import shared_task

from .services import usage_collect_fleet


@shared_task(name="usage.tasks.usage_collect_task", ignore_result=True)
def usage_collect_task() -> int:
    return usage_collect_fleet()
