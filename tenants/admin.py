"""Staff admin for operators, tokens, tenants and the audit log. Token secrets are never stored or shown."""

from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin

from .models import AuditLog, Operator, OperatorToken, Tenant


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "tenant_quota", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "operator", "name", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["operator"]
    exclude = ["secret_hash"]


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ["slug", "operator", "status", "plan", "created_at"]
    list_filter = ["status", "operator"]
    search_fields = ["slug", "name", "id"]
    exclude = ["request_fingerprint"]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_label", "action", "target_type", "target_id", "tenant"]
    list_filter = ["action", "actor_kind"]
    search_fields = ["action", "target_id", "actor_label"]
