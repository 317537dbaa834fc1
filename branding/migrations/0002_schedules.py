"""Register the branding sweep with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import register_periodic_tasks, unregister_periodic_tasks

SCHEDULES = [
    # (name, task, every seconds)
    ("Resume stalled branding jobs", "branding.tasks.resume_stalled_rollouts", 30),
]


def create(apps, schema_editor):
    register_periodic_tasks(apps, SCHEDULES)


def remove(apps, schema_editor):
    unregister_periodic_tasks(apps, SCHEDULES)


class Migration(migrations.Migration):
    dependencies = [
        ("branding", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
