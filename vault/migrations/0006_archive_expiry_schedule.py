"""Register the archive-expiry and crypto-shredding job with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds): the new entry of vault.schedules.SCHEDULES
    ("Expire archives and shred retired data keys", "vault.tasks.archives_expire_and_shred_task", 3600),
]


class Migration(migrations.Migration):
    dependencies = [
        ("vault", "0005_sealed_archives_and_destroyed_keys"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
