"""Register the stalled-rollout sweep with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Resume stalled release rollouts", "releases.tasks.resume_stalled_release_rollouts", 30),
]


class Migration(migrations.Migration):
    dependencies = [
        ("releases", "0002_assignments_and_rollouts"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
