from django.contrib import admin

from .models import EgressDecision, EgressRule


@admin.register(EgressRule)
class EgressRuleAdmin(admin.ModelAdmin):
    list_display = ("host", "port", "operator", "tenant", "release", "note", "created_at")
    list_filter = ("operator",)
    search_fields = ("host", "note")


@admin.register(EgressDecision)
class EgressDecisionAdmin(admin.ModelAdmin):
    list_display = ("at", "tenant", "allowed", "reason", "kind", "host", "port", "bytes_up", "bytes_down",
                    "duration_ms")
    list_filter = ("allowed", "reason")
    readonly_fields = [f.name for f in EgressDecision._meta.fields]
