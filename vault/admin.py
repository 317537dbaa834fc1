"""Staff admin for vault metadata: key versions, credential names and versions, rotation jobs, sealed archives.

Values, ciphertexts and key bytes are never shown (excluded fields, read-only admins).
Rotation is triggered by admin actions that call the rotation services.
"""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import ApplicationError
from tenants.actors import Actor

from .choices import KeyPurpose
from .models import Credential, CredentialVersion, RotationJob, SealedArchive, TenantDataKey
from .rotation import data_key_rotate_start, kek_rotate_start, rotation_job_resume


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, started: list[str], errors: list[str]) -> None:
    if started:
        modeladmin.message_user(request, "Rotation queued: " + "; ".join(started), messages.SUCCESS)
    for error in errors:
        modeladmin.message_user(request, error, messages.ERROR)


@admin.register(TenantDataKey)
class TenantDataKeyAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "purpose", "version", "kek_id", "kek_fingerprint", "status", "created_at", "retired_at",
                    "destroyed_at"]
    list_filter = ["purpose", "status"]
    exclude = ["wrapped_key"]
    actions = ["rotate_data_key", "rewrap_all_under_newest_kek"]

    @admin.action(description="Rotate the data key of the selected keys' tenants (new version, re-encrypt)")
    def rotate_data_key(self, request: HttpRequest, queryset: QuerySet[TenantDataKey]) -> None:
        started, errors = [], []
        for tenant_id, purpose in sorted(set(queryset.values_list("tenant_id", "purpose"))):
            key = queryset.filter(tenant_id=tenant_id, purpose=purpose).select_related("tenant").first()
            assert key is not None
            try:
                job = data_key_rotate_start(tenant=key.tenant, purpose=purpose, actor=Actor.for_user(request.user))
                started.append(f"{key.tenant} {purpose} -> v{job.target}")
            except ApplicationError as exc:
                errors.append(f"{key.tenant} {purpose}: {exc.detail}")
        _report(self, request, started, errors)

    @admin.action(description="Re-wrap ALL tenants' data keys under the newest key-encryption key")
    def rewrap_all_under_newest_kek(self, request: HttpRequest, queryset: QuerySet[TenantDataKey]) -> None:
        try:
            job = kek_rotate_start(actor=Actor.for_user(request.user))
            _report(self, request, [f"all data keys -> {job.target} ({job.total} to re-wrap)"], [])
        except ApplicationError as exc:
            _report(self, request, [], [exc.detail])


class CredentialVersionInline(admin.TabularInline):
    model = CredentialVersion
    fields = ["version", "data_key_version", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Credential)
class CredentialAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "current_version", "one_time", "updated_at", "last_used_at", "revoked_at",
                    "consumed_at"]
    search_fields = ["name"]
    inlines = [CredentialVersionInline]
    actions = ["rotate_tenant_key"]

    @admin.action(description="Rotate the credentials data key of the selected credentials' tenants")
    def rotate_tenant_key(self, request: HttpRequest, queryset: QuerySet[Credential]) -> None:
        started, errors = [], []
        for credential in queryset.select_related("tenant").order_by("tenant_id").distinct("tenant_id"):
            try:
                job = data_key_rotate_start(tenant=credential.tenant, purpose=KeyPurpose.CREDENTIALS,
                                            actor=Actor.for_user(request.user))
                started.append(f"{credential.tenant} -> v{job.target}")
            except ApplicationError as exc:
                errors.append(f"{credential.tenant}: {exc.detail}")
        _report(self, request, started, errors)


@admin.register(RotationJob)
class RotationJobAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "kind", "tenant", "purpose", "target", "status", "done", "total", "finished_at"]
    list_filter = ["kind", "status"]
    readonly_fields = ["error", "details"]
    actions = ["resume"]

    @admin.action(description="Resume or retry the selected rotation jobs")
    def resume(self, request: HttpRequest, queryset: QuerySet[RotationJob]) -> None:
        started, errors = [], []
        for job in queryset:
            try:
                rotation_job_resume(job=job, actor=Actor.for_user(request.user))
                started.append(str(job.pk))
            except ApplicationError as exc:
                errors.append(f"{job.pk}: {exc.detail}")
        _report(self, request, started, errors)


@admin.register(SealedArchive)
class SealedArchiveAdmin(ReadOnlyAdmin):
    """What each object-key version still seals in the store; the expiry job alone changes these rows."""

    list_display = ["tenant", "name", "label", "key_version", "state", "taken_at", "expires_at", "deleted_at",
                    "discovered"]
    list_filter = ["state", "label", "discovered"]
    search_fields = ["name", "tenant__slug"]
