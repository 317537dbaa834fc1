"""Mounted under ``/internal/v1/`` (controlplane/urls.py): the instance-facing half of schedules."""

from django.urls import path

from . import internal

urlpatterns = [
    path("schedules", internal.AgentScheduleCreateView.as_view(), name="internal-schedules"),
    path("schedules/by-key/<str:key>", internal.AgentScheduleByKeyView.as_view(), name="internal-schedule-by-key"),
]
