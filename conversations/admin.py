"""Staff admin for the inbox and customer tokens (read-only; token secrets are never stored or shown)."""

from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin

from .models import CustomerToken, InboxItem


@admin.register(InboxItem)
class InboxItemAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "kind", "thread", "status", "attempts", "created_at", "delivered_at"]
    list_filter = ["status", "kind"]
    search_fields = ["id", "thread"]
    exclude = ["request_fingerprint"]


@admin.register(CustomerToken)
class CustomerTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "tenant", "scopes", "created_at", "expires_at", "revoked_at"]
    list_filter = ["operator"]
    exclude = ["secret_hash"]
