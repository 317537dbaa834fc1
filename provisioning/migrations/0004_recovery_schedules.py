"""Register the recovery jobs with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

SCHEDULES = [
    # (name, task, every seconds)
    ("Recovery sweep: dead and hung instances", "provisioning.tasks.recovery_sweep_task", 5),
    ("Drift check: missing or changed resources", "provisioning.tasks.drift_check_task", 60),
    ("Heartbeats: copy to PostgreSQL", "provisioning.tasks.heartbeats_sync_task", 15),
    ("Schema backups", "provisioning.tasks.schema_backups_task", 600),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every in SCHEDULES:
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
        PeriodicTask.objects.update_or_create(name=name, defaults={"task": task, "interval": interval})


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[s[0] for s in SCHEDULES]).delete()


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0003_recovery")]
    operations = [migrations.RunPython(create, remove)]
