"""Operators (white-label resellers), their API tokens, their tenants (customers) and the audit log.

No business rules here: lifecycle transitions live in ``services.tenant_transition``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from .choices import ActorKind, TenantStatus


class Operator(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    domains = ArrayField(models.CharField(max_length=253), default=list, blank=True)
    # Branding: shown in the operator's portal and rolled out to every instance of its customers.
    product_name = models.CharField(max_length=100, blank=True)
    logo_url = models.URLField(blank=True)
    primary_color = models.CharField(max_length=7, default="#1f4b99")
    background_color = models.CharField(max_length=7, default="#ffffff")
    support_email = models.EmailField(blank=True)
    tenant_quota = models.PositiveIntegerField(default=1000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class OperatorToken(models.Model):
    """An API token. Only a SHA-256 of the secret is stored; the token is shown once at issue time."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=12, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=40), default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.operator.slug}:{self.prefix}"


class Plan(models.Model):
    """What a customer is sold: a record (not free text) so the API refuses a plan nobody offers.

    Quotas are enforced where the work enters the control plane (the conversations inbox counts a day's
    messages and tasks); ``None`` means no limit. In the Kubernetes profile a plan's CPU, memory and storage
    come from ``KUBERNETES_PLANS`` under the same slug, and a plan the runtime cannot size is refused at the API.
    """

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True, help_text="Inactive plans keep their tenants but take no new ones.")
    max_messages_per_day = models.PositiveIntegerField(null=True, blank=True)
    max_tasks_per_day = models.PositiveIntegerField(null=True, blank=True)
    # Monthly limits (UTC calendar month), checked in the same statement as the daily ones: a new task or message
    # is refused (429) once the month's usage reaches them; work already running is never stopped.
    max_tasks_per_month = models.PositiveIntegerField(
        null=True, blank=True, help_text="tasks and messages a UTC month (counted in the inbox); empty: unlimited")
    max_tokens_per_month = models.BigIntegerField(
        null=True, blank=True, help_text="model tokens in+out a UTC month (as collected into usage); empty: unlimited")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="tenants")
    slug = models.SlugField(max_length=63)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=TenantStatus.choices, default=TenantStatus.PENDING)
    status_reason = models.TextField(blank=True)
    # The column keeps its name and holds the plan's slug, so ``tenant.plan_id`` is the slug everywhere.
    plan = models.ForeignKey(Plan, to_field="slug", db_column="plan", on_delete=models.PROTECT,
                             related_name="tenants", default="standard")
    # Stripe-style metadata: the operator's own keys (their CRM id, region...), at most 50, strings only.
    metadata = models.JSONField(default=dict, blank=True)
    # NULL (not "") when absent, so the per-operator unique constraint ignores keyless requests.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # A slug is unique among an operator's live tenants; a deleted tenant frees its slug.
            models.UniqueConstraint(
                fields=["operator", "slug"],
                condition=~models.Q(status=TenantStatus.DELETED),
                name="tenant_slug_unique_per_operator",
            ),
            models.UniqueConstraint(
                fields=["operator", "idempotency_key"], name="tenant_idempotency_key_unique_per_operator"
            ),
        ]
        indexes = [models.Index(fields=["operator", "status"])]

    def __str__(self) -> str:
        return f"{self.operator.slug}/{self.slug}"

    @property
    def resource_name(self) -> str:
        """Schema, role, namespace and directory name: derived from the id, never from user input."""
        return f"{settings.TENANT_NAME_PREFIX}{self.id.hex}"


class AuditLog(models.Model):
    """Every state change, with who did it; written in the same transaction as the change."""

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_kind = models.CharField(max_length=20, choices=ActorKind.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    actor_label = models.CharField(max_length=200, blank=True)
    operator = models.ForeignKey(Operator, null=True, blank=True, on_delete=models.SET_NULL)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=80, db_index=True)
    target_type = models.CharField(max_length=80, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action}"
