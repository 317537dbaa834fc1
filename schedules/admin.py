"""Staff admin for schedules and their fires (read-only: changes go through the API, which audits them)."""

from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin

from .models import Schedule, ScheduleFire


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = ["name", "tenant", "cron", "timezone", "at", "target_type", "catch_up", "status", "next_fire_at"]
    list_filter = ["status", "target_type", "catch_up"]
    search_fields = ["id", "name"]


@admin.register(ScheduleFire)
class ScheduleFireAdmin(ReadOnlyAdmin):
    list_display = ["schedule", "fire_time", "status", "attempts", "inbox_item", "dispatched_at"]
    list_filter = ["status"]
