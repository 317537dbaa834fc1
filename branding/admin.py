from django.contrib import admin

from .models import BrandingDeployment, BrandingRevision, RolloutJob, Theme


@admin.register(Theme)
class ThemeAdmin(admin.ModelAdmin):
    list_display = ["operator", "version", "content_hash", "activated_at"]
    list_filter = ["operator"]
    readonly_fields = [f.name for f in Theme._meta.fields]


@admin.register(BrandingRevision)
class BrandingRevisionAdmin(admin.ModelAdmin):
    list_display = ["operator", "status", "submitted_by", "created_at"]
    list_filter = ["status"]
    exclude = ["raw_logo"]


@admin.register(RolloutJob)
class RolloutJobAdmin(admin.ModelAdmin):
    list_display = ["operator", "theme", "status", "done", "total", "failed", "updated_at"]
    list_filter = ["status"]


@admin.register(BrandingDeployment)
class BrandingDeploymentAdmin(admin.ModelAdmin):
    list_display = ["tenant", "content_hash", "driver", "published_at", "publish_count"]
