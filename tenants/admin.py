"""Staff admin for operators, plans, tokens, tenants and the audit log. Token secrets are never stored or shown."""

from django.contrib import admin
from django.http import HttpRequest

from controlplane.admin import ReadOnlyAdmin

from .models import AuditLog, Operator, OperatorToken, Plan, Tenant


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "tenant_quota", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Staff add plans and retire them by unticking "active": tenants keep theirs, new tenants cannot pick it.

    The slug is fixed once saved, because tenants reference a plan by it (``Tenant.plan`` is keyed on the slug,
    as is ``KUBERNETES_PLANS``); a plan is never deleted, since its tenants would lose what they were sold.
    """

    list_display = ["slug", "name", "is_active", "max_messages_per_day", "max_tasks_per_day", "max_tasks_per_month",
                    "max_tokens_per_month", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["slug", "name"]

    def get_readonly_fields(self, request: HttpRequest, obj: Plan | None = None) -> list[str]:
        return ["slug", "created_at"] if obj is not None else ["created_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Plan | None = None) -> bool:
        return False


@admin.register(OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "operator", "name", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["operator"]
    exclude = ["secret_hash"]


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ["slug", "operator", "status", "plan", "created_at"]
    list_select_related = ["operator", "plan"]
    list_filter = ["status", "operator"]
    search_fields = ["slug", "name", "id"]
    exclude = ["request_fingerprint"]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_label", "action", "target_type", "target_id", "tenant"]
    # A tenant prints as operator/slug: without the joins the change list runs two queries per row.
    list_select_related = ["tenant", "tenant__operator"]
    list_filter = ["action", "actor_kind"]
    search_fields = ["action", "target_id", "actor_label"]
