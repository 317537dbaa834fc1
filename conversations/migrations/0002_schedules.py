"""Registered the inbox delivery job with django-celery-beat.

The jobs are now declared once, in ``controlplane/periodic.py``, and written after every migrate by
``periodic_jobs_sync`` (which adopts the rows this migration made on databases that ran it). Kept, empty, so
the migration history of existing databases stays valid.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = []
