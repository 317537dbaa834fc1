from django.urls import path

from . import views

T = "tenants/<str:tenant_id>"

urlpatterns = [
    path(f"{T}/schedules", views.ScheduleListView.as_view(), name="tenant-schedules"),
    path(f"{T}/schedules/<str:schedule_id>", views.ScheduleDetailView.as_view(), name="tenant-schedule"),
    path(f"{T}/schedules/<str:schedule_id>/fires", views.ScheduleFireListView.as_view(), name="tenant-schedule-fires"),
]
