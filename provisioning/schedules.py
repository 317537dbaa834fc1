"""The periodic jobs, as one list: registered in django-celery-beat by migrations and ``schedules_ensure``."""

from __future__ import annotations

__all__ = ["SCHEDULES", "schedules_ensure"]

SCHEDULES: list[tuple[str, str, int]] = [
    # (name, task, every seconds)
    ("Resume stalled workflows", "provisioning.tasks.resume_stalled_workflows", 15),
    ("Recovery sweep: dead and hung instances", "provisioning.tasks.recovery_sweep_task", 5),
    ("Drift check: missing or changed resources", "provisioning.tasks.drift_check_task", 60),
    ("Heartbeats: copy to PostgreSQL", "provisioning.tasks.heartbeats_sync_task", 15),
    ("Schema backups", "provisioning.tasks.schema_backups_task", 600),
    ("Sleep: idle instances to sleep, waiting ones woken", "provisioning.tasks.instance_sleep_sweep_task", 30),
]


def schedules_ensure() -> int:
    """(Re)register provisioning's periodic jobs; existing entries keep any interval staff changed."""
    from django.apps import apps

    from controlplane.beat import register_periodic_tasks

    return register_periodic_tasks(apps, SCHEDULES, keep_existing=True)
