from django.contrib import admin

from .models import OperatorMembership


@admin.register(OperatorMembership)
class OperatorMembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "operator", "role", "created_at"]
    list_filter = ["role", "operator"]
    raw_id_fields = ["user"]
