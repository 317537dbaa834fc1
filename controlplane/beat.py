"""Registering periodic jobs with django-celery-beat: one implementation for every app's data migration.

Migrations pass their historical ``apps`` registry, so this keeps working as the models evolve.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_periodic_tasks", "unregister_periodic_tasks", "periodic_tasks_operation"]

Schedule = tuple[str, str, int]  # (name, task, every seconds)


def register_periodic_tasks(apps: Any, schedules: list[Schedule], *, keep_existing: bool = False) -> int:
    """Create (or update) one interval PeriodicTask per schedule; ``keep_existing`` leaves staff edits alone."""
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    created = 0
    for name, task, every in schedules:
        if keep_existing and task_model.objects.filter(name=name).exists():
            continue
        interval, _ = interval_model.objects.get_or_create(every=every, period="seconds")
        task_model.objects.update_or_create(name=name, defaults={"task": task, "interval": interval})
        created += 1
    return created


def unregister_periodic_tasks(apps: Any, schedules: list[Schedule]) -> None:
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name__in=[s[0] for s in schedules]).delete()


def periodic_tasks_operation(schedules: list[Schedule]) -> Any:
    """The data-migration operation that registers ``schedules`` (and removes them when unapplied)."""
    from django.db import migrations

    return migrations.RunPython(lambda apps, _editor: register_periodic_tasks(apps, schedules),
                                lambda apps, _editor: unregister_periodic_tasks(apps, schedules))
