"""The Celery app. Tasks live in each app's ``tasks.py`` and stay thin: ids in, a service call, done.

Without ``CELERY_BROKER_URL`` the broker is kombu's filesystem transport under
``var/broker`` (configured in settings).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
