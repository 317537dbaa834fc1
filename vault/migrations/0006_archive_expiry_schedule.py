"""Registered the archive-expiry and crypto-shredding job with django-celery-beat.

The jobs are now declared once, in ``controlplane/periodic.py``, and written after every migrate by
``periodic_jobs_sync`` (which adopts the rows this migration made on databases that ran it). Kept, empty, so
the migration history of existing databases stays valid.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("vault", "0005_sealed_archives_and_destroyed_keys"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = []
