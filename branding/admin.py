"""Branding in the admin: history to read, never to edit (themes are immutable, revisions are reviewed in the
portal and the dashboard, rollouts are driven by their workflow: a hand-edited cursor would skip instances)."""

from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin

from .models import BrandingDeployment, BrandingRevision, RolloutJob, Theme


@admin.register(Theme)
class ThemeAdmin(ReadOnlyAdmin):
    list_display = ["operator", "version", "content_hash", "activated_at"]
    list_filter = ["operator"]


@admin.register(BrandingRevision)
class BrandingRevisionAdmin(ReadOnlyAdmin):
    list_display = ["operator", "status", "submitted_by", "created_at"]
    list_filter = ["status"]
    exclude = ["raw_logo"]


@admin.register(RolloutJob)
class RolloutJobAdmin(ReadOnlyAdmin):
    list_display = ["operator", "theme", "status", "done", "total", "failed", "updated_at"]
    list_filter = ["status"]


@admin.register(BrandingDeployment)
class BrandingDeploymentAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "content_hash", "driver", "published_at", "publish_count"]
