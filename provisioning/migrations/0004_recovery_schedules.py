"""Registered the recovery jobs with django-celery-beat.

The jobs are now declared once, in ``controlplane/periodic.py``, and written after every migrate by
``periodic_jobs_sync`` (which adopts the rows this migration made on databases that ran it). Kept, empty, so
the migration history of existing databases stays valid.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0003_recovery")]
    operations = []
