"""Events, webhook endpoints, deliveries and their attempts. Rows are history: nothing here is deleted.

An endpoint's signing secret is stored wrapped by the vault's key-encryption key (``vault.kek``), bound to
the endpoint's id, and is unwrapped only to sign a request; the API shows it once, at creation.
"""

from __future__ import annotations

import secrets
import time
import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from tenants.models import Operator, Tenant

from .choices import DeliveryStatus, EndpointStatus

__all__ = ["Event", "RuntimeEventCursor", "WebhookEndpoint", "WebhookDelivery", "WebhookAttempt", "new_event_id"]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_event_id() -> str:
    """``evt_`` + a ULID: 48 bits of milliseconds then 80 random bits, so ids sort by creation time and the
    keyset cursor over them reads newest first without a second ordering column."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "evt_" + "".join(reversed(chars))


class Event(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_event_id, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="events")
    tenant = models.ForeignKey(Tenant, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    type = models.CharField(max_length=60)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The fact an event detected in an instance's tables reports (``webhooks.runtime_events``: "task:<id>:<status>
    # :<when>", "reply:<seq>"), unique per tenant, so a fact read again (the sweep's overlap, a replayed cursor) is
    # never a second event. NULL for events from the audit trail, which happen once by construction.
    fact_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001

    class Meta:
        indexes = [models.Index(fields=["operator", "-id"]), models.Index(fields=["operator", "type", "-id"])]
        constraints = [models.UniqueConstraint(fields=["tenant", "fact_key"], name="webhook_event_once_per_fact",
                                               condition=models.Q(fact_key__isnull=False))]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class RuntimeEventCursor(models.Model):
    """How far the webhooks sweep has read a tenant's runtime tables for task outcomes and replies: the newest
    ``tasks.updated_at`` and ``messages.created_at`` it has seen (``webhooks.runtime_events``)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True,
                                  related_name="runtime_event_cursor")
    tasks_after = models.DateTimeField()
    replies_after = models.DateTimeField()
    polled_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.tenant_id}: tasks {self.tasks_after}, replies {self.replies_after}"


class WebhookEndpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    # Empty: every event type. Entries are exact types or "<prefix>.*".
    event_types = ArrayField(models.CharField(max_length=60), default=list, blank=True)
    is_active = models.BooleanField(default=True)
    status = models.CharField(max_length=20, choices=EndpointStatus.choices, default=EndpointStatus.ACTIVE)
    failing_since = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # The signing secret, wrapped (vault.kek.WrappedKey fields); never stored or logged in the clear.
    secret_kek_id = models.CharField(max_length=300)
    secret_blob = models.BinaryField()
    secret_fingerprint = models.CharField(max_length=40, blank=True)
    secret_hint = models.CharField(max_length=20, blank=True)  # "whsec_…" + last 4 characters, for people
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["operator", "deleted_at"])]

    def __str__(self) -> str:
        return f"{self.operator.slug}: {self.url}"


class WebhookDelivery(models.Model):
    """One event to one endpoint. ``run_attempts`` counts attempts since it was last (re)queued."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="deliveries")
    status = models.CharField(max_length=20, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    run_attempts = models.PositiveIntegerField(default=0)
    replays = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while one worker is posting it; another worker (a duplicate message, the sweep) leaves it alone.
    lease_until = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "event"], name="webhook_delivery_once_per_event")]
        verbose_name_plural = "webhook deliveries"  # Django's default plural says "deliverys"
        indexes = [models.Index(fields=["status", "next_attempt_at"]), models.Index(fields=["endpoint", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.endpoint_id} ({self.status})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_log")
    number = models.PositiveIntegerField()
    attempted_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    # The start of the receiver's answer, for the delivery log (the receiver's text, never ours).
    response_excerpt = models.CharField(max_length=500, blank=True)
    # What was posted: the JSON body the signature covers (the secret and the signature headers are not in it).
    request_body = models.TextField(blank=True)
    # The receiver's answer: its first WEBHOOK_LOG_RESPONSE_BYTES, and only the headers ``targets`` lets through.
    response_body = models.TextField(blank=True)
    response_truncated = models.BooleanField(default=False)
    response_headers = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}"
