"""The one read-only admin base. State changes go through services (dashboard actions, API, admin
actions that call services), never through raw admin edits or deletes: deleting a tenant, resource,
key or audit row here would skip deprovisioning, orphan external resources or destroy history."""

from __future__ import annotations

from django.contrib import admin

__all__ = ["ReadOnlyAdmin"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# The product's name on every admin page instead of "Django administration".
admin.site.site_header = "Agent control plane: administration"
admin.site.site_title = "Agent control plane admin"
admin.site.index_title = "Records (read-only history; change state from the dashboard)"
