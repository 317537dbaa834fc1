from django.contrib import admin

from .models import ModelPrice, UsageDay


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    list_display = ("day", "tenant", "tasks_submitted", "tasks_done", "steps_run", "compute_s", "input_tokens",
                    "output_tokens", "collected_at")
    list_filter = ("day",)
    list_select_related = ("tenant",)
    search_fields = ("tenant__slug",)
    readonly_fields = [f.name for f in UsageDay._meta.fields]


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """Staff set the platform's default prices (no operator) and an operator's own where it bills differently."""

    list_display = ("model", "operator", "input_usd_per_mtok", "output_usd_per_mtok", "updated_at")
    list_filter = (("operator", admin.EmptyFieldListFilter),)
    list_select_related = ("operator",)
    search_fields = ("model", "operator__slug")
    autocomplete_fields = ("operator",)
