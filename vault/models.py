"""Wrapped per-tenant data keys, versioned encrypted credentials and rotation jobs.

No plaintext (credential value or key bytes) is ever stored here: data keys are wrapped by a
key-encryption key, credential values are sealed with the tenant's data key. ``SealedArchive`` records
what a data key sealed outside the vault (archives in the object store), so a key version is destroyed
only once nothing it sealed can still exist.
"""

from __future__ import annotations

import uuid

from django.db import models

from tenants.models import Tenant

from .choices import (
    ACTIVE_ROTATION_STATUSES,
    ArchiveState,
    KeyPurpose,
    KeyStatus,
    RotationKind,
    RotationStatus,
)
from .kek import WrappedKey


class TenantDataKey(models.Model):
    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="data_keys")
    purpose = models.CharField(max_length=20, choices=KeyPurpose.choices, default=KeyPurpose.CREDENTIALS)
    version = models.PositiveIntegerField()
    kek_id = models.CharField(max_length=300)
    # Fingerprint of the key-encryption key that wrapped it (vault.kek.kek_fingerprint, or
    # kms_fingerprint of the KMS key ARN): never key material. NULL: wrapped before fingerprints were
    # recorded; such rows unwrap by kek_id version as before (NULL, not "", so "legacy" is unmistakable).
    kek_fingerprint = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    wrapped_key = models.BinaryField()
    status = models.CharField(max_length=20, choices=KeyStatus.choices, default=KeyStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    # Set when the wrapped bytes were erased (vault.shredding); kek_id and kek_fingerprint stay, naming the
    # key-encryption key whose older copies (database backups) could still unwrap it.
    destroyed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "purpose", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "purpose", "version"], name="one_data_key_version"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.purpose} v{self.version} ({self.kek_id})"

    @property
    def wrapped(self) -> WrappedKey:
        return WrappedKey(self.kek_id, bytes(self.wrapped_key), self.kek_fingerprint or None)


class Credential(models.Model):
    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="credentials")
    name = models.CharField(max_length=100)
    current_version = models.PositiveIntegerField(default=0)
    one_time = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="one_credential_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.name} v{self.current_version}"


class CredentialVersion(models.Model):
    id = models.BigAutoField(primary_key=True)
    credential = models.ForeignKey(Credential, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    data_key_version = models.PositiveIntegerField()
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["credential", "-version"]
        constraints = [models.UniqueConstraint(fields=["credential", "version"], name="one_credential_version")]

    def __str__(self) -> str:
        return f"{self.credential.name} v{self.version}"


class RotationJob(models.Model):
    """Progress of one rotation, committed per unit of work so a killed worker resumes where it was.

    ``kek``: re-wrap every data key under ``target`` (a kek id); ``tenant`` is NULL.
    ``data_key``: re-encrypt ``tenant``'s credentials under data-key version ``target``, then retire
    the older versions. ``cursor`` is the id of the last row processed (keys or credential versions).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20, choices=RotationKind.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="rotation_jobs"
    )
    purpose = models.CharField(max_length=20, choices=KeyPurpose.choices, blank=True)
    status = models.CharField(max_length=20, choices=RotationStatus.choices, default=RotationStatus.PENDING)
    target = models.CharField(max_length=300)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    cursor = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    requested_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One unfinished rotation per scope; NULL tenants (KEK jobs) count as the same scope.
            models.UniqueConstraint(
                fields=["kind", "tenant", "purpose"],
                condition=models.Q(status__in=ACTIVE_ROTATION_STATUSES),
                nulls_distinct=False,
                name="one_active_rotation_per_scope",
            ),
        ]
        indexes = [models.Index(fields=["status", "updated_at"])]

    def __str__(self) -> str:
        scope = f" {self.tenant_id} {self.purpose}" if self.tenant_id else ""
        return f"{self.kind}{scope} -> {self.target} ({self.status} {self.done}/{self.total})"


class SealedArchive(models.Model):
    """One archive (a schema dump) sealed under a version of the tenant's object key and kept in the object store.

    Written when the archive is stored (``provisioning.databases.archives``) or, for one stored before this record
    existed or by a process that died before recording it, when the expiry job's inventory of the store finds
    it. ``key_version`` None: the inventory could not tell which version sealed it; it then keeps every object
    key version of the tenant alive until it is deleted. ``state`` moves stored -> deleting -> deleted, and only
    ``deleted`` claims the object is gone.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sealed_archives")
    name = models.CharField(max_length=300)
    url = models.CharField(max_length=1000)
    label = models.CharField(max_length=40, blank=True)
    key_version = models.PositiveIntegerField(null=True, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    taken_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    state = models.CharField(max_length=20, choices=ArchiveState.choices, default=ArchiveState.STORED)
    discovered = models.BooleanField(default=False)  # found by the inventory, not recorded when it was written
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-taken_at"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="one_sealed_archive_per_name")]
        indexes = [models.Index(fields=["state", "expires_at"])]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.name} ({self.state})"
