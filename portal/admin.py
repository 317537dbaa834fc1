"""Staff admin for portal memberships and invitations.

Memberships stay editable for support (role changes); operators invite people from the portal's Team page
instead of typing user ids here. Invitations are history: read-only, and their token hash is not shown.
"""

from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin

from .models import OperatorInvitation, OperatorMembership


@admin.register(OperatorMembership)
class OperatorMembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "operator", "role", "created_at"]
    list_filter = ["role", "operator"]
    search_fields = ["user__username", "user__email", "operator__slug"]
    autocomplete_fields = ["user"]


@admin.register(OperatorInvitation)
class OperatorInvitationAdmin(ReadOnlyAdmin):
    list_display = ["email", "operator", "role", "created_at", "expires_at", "accepted_at", "revoked_at"]
    list_filter = ["role", "operator"]
    search_fields = ["email"]
    exclude = ["token_hash"]
