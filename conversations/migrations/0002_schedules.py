"""Register the inbox delivery job with django-celery-beat (editable by staff afterwards)."""

from django.db import migrations

from controlplane.beat import periodic_tasks_operation

SCHEDULES = [
    # (name, task, every seconds)
    ("Inbox: deliver pending messages and tasks", "conversations.tasks.inbox_deliver_pending", 5),
]


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [periodic_tasks_operation(SCHEDULES)]
