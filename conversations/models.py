"""The durable inbox (what was sent to an instance, written before any delivery), thread settings and customer
tokens.

No business rules here: ``services`` writes these rows, ``selectors`` reads them.
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models

from tenants.models import Operator, OperatorToken, Tenant

from .choices import DEFAULT_THREAD_POLICY, InboxKind, InboxStatus, ThreadPolicy


class InboxItem(models.Model):
    """One message, task, cancel or decision for a tenant's instance. Its id is the id the instance sees."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="inbox_items")
    kind = models.CharField(max_length=20, choices=InboxKind.choices)
    thread = models.CharField(max_length=200, blank=True)  # messages only
    # The end user of the tenant this message or task acts for (tenants.end_users), as the operator's API call
    # named it (or the customer token it came with was bound to); None: the tenant as a whole. Never set by the
    # instance: the connections delivery reads it here to pick whose connected account a task may use.
    end_user = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None is "no end user"
    payload = models.JSONField(default=dict, blank=True)
    # NULL (not "") when absent, so the unique constraint ignores keyless requests.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=20, choices=InboxStatus.choices, default=InboxStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The instance's answer: its JSON body when delivered, its problem when refused.
    response = models.JSONField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "idempotency_key"],
                                    name="inbox_idempotency_key_unique_per_tenant_kind"),
        ]
        indexes = [models.Index(fields=["tenant", "status", "created_at"], name="inbox_tenant_status_created")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"


class CustomerToken(models.Model):
    """A short-lived token for one tenant and a few scopes (Stripe's ephemeral keys). Only a hash is stored."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="customer_tokens")
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="customer_tokens")
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=40), default=list)
    # Bound to one end user of the tenant (tenants.end_users): what it sends acts for that end user, the connect
    # flows it starts are theirs, and it sees only their connections. None: the tenant as a whole.
    end_user = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None is "no end user"
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(OperatorToken, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="customer_tokens")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "expires_at"])]

    def __str__(self) -> str:
        return f"{self.tenant}:{self.prefix}"


class ThreadSetting(models.Model):
    """A thread's own settings, kept by the control plane: it decides `reject` before the inbox, and a thread
    exists on the instance only once its first message did (its log lives there, append-only). A thread without a
    row has the defaults."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="thread_settings")
    thread = models.CharField(max_length=200)
    policy = models.CharField(max_length=20, choices=ThreadPolicy.choices, default=DEFAULT_THREAD_POLICY)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "thread"], name="thread_setting_unique")]

    def __str__(self) -> str:
        return f"{self.tenant}:{self.thread} ({self.policy})"
