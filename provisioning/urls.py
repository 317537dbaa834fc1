"""Provisioning's pages outside the versioned API: the Prometheus scrape at ``/metrics`` (``metrics.py``)."""

from django.urls import path

from provisioning.recovery.metrics import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
