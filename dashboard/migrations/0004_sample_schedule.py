"""Register the history sampler with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Dashboard: sample heartbeat age and fleet status", "dashboard.tasks.history_sample_task", 60),
]


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0003_history_samples"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
