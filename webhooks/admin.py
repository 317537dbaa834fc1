"""Read-only admin: events and deliveries are history, and an endpoint's secret is never shown."""

from __future__ import annotations

from django.contrib import admin

from .models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "type", "operator", "tenant", "created_at")
    list_filter = ("type",)
    search_fields = ("id", "type")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ("url", "operator", "status", "is_active", "failing_since", "last_success_at", "deleted_at")
    list_filter = ("status", "is_active")
    exclude = ("secret_blob", "secret_kek_id", "secret_fingerprint")


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "attempted_at", "duration_ms", "status_code", "error", "response_excerpt")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("event", "endpoint", "status", "attempts", "next_attempt_at", "last_status_code")
    list_filter = ("status",)
    inlines = [AttemptInline]
