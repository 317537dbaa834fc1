"""Control plane Django project: settings, URLs, the Celery app and the shared API plumbing."""

from .celery import app as celery_app

__all__ = ["celery_app"]
