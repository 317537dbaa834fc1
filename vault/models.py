"""Wrapped per-tenant data keys and versioned, encrypted credentials. No plaintext is ever stored."""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant

from .choices import KeyPurpose, KeyStatus


class TenantDataKey(models.Model):
    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="data_keys")
    purpose = models.CharField(max_length=20, choices=KeyPurpose.choices, default=KeyPurpose.CREDENTIALS)
    version = models.PositiveIntegerField()
    kek_id = models.CharField(max_length=300)
    wrapped_key = models.BinaryField()
    status = models.CharField(max_length=20, choices=KeyStatus.choices, default=KeyStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "purpose", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "purpose", "version"], name="one_data_key_version"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.purpose} v{self.version} ({self.kek_id})"


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
