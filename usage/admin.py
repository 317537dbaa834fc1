from django.contrib import admin

from .models import UsageDay


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    list_display = ("day", "tenant", "tasks_submitted", "tasks_done", "steps_run", "compute_s", "input_tokens",
                    "output_tokens", "collected_at")
    list_filter = ("day",)
    list_select_related = ("tenant",)
    search_fields = ("tenant__slug",)
    readonly_fields = [f.name for f in UsageDay._meta.fields]
