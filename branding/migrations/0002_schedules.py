"""Register the branding sweep with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

SCHEDULES = [
    # (name, task, every seconds)
    ("Resume stalled branding jobs", "branding.tasks.resume_stalled_rollouts", 30),
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
    dependencies = [
        ("branding", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
