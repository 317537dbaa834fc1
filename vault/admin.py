"""Staff admin for vault metadata: key versions and credential names. Values and key bytes never shown."""

from django.contrib import admin

from .models import Credential, TenantDataKey


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(TenantDataKey)
class TenantDataKeyAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "purpose", "version", "kek_id", "status", "created_at", "retired_at"]
    list_filter = ["purpose", "status"]
    exclude = ["wrapped_key"]


@admin.register(Credential)
class CredentialAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "current_version", "one_time", "updated_at", "last_used_at", "revoked_at"]
    search_fields = ["name"]
