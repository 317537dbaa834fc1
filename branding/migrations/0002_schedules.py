"""Register the branding sweep with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Resume stalled branding jobs", "branding.tasks.resume_stalled_rollouts", 30),
]


class Migration(migrations.Migration):
    dependencies = [
        ("branding", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
