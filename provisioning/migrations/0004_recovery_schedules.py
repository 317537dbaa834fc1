"""Register the recovery jobs with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Recovery sweep: dead and hung instances", "provisioning.tasks.recovery_sweep_task", 5),
    ("Drift check: missing or changed resources", "provisioning.tasks.drift_check_task", 60),
    ("Heartbeats: copy to PostgreSQL", "provisioning.tasks.heartbeats_sync_task", 15),
    ("Schema backups", "provisioning.tasks.schema_backups_task", 600),
]


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0003_recovery")]
    operations = [periodic_tasks_operation(SCHEDULES)]
