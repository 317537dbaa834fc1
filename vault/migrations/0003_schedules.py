"""Register the vault's periodic job with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Resume stalled key rotations", "vault.tasks.resume_stalled_rotations", 30),
]


class Migration(migrations.Migration):
    dependencies = [
        ("vault", "0002_rotation_job"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
