"""Branding submissions, content-addressed assets, versioned themes, rollout jobs and what each instance has.

No business rules here: validation is in ``validation.py``, writes in ``services.py``.
"""

from __future__ import annotations

import uuid

from django.db import models

from tenants.models import Operator, Tenant

from .choices import ACTIVE_ROLLOUT_STATUSES, RevisionStatus, RolloutStatus


class BrandingAsset(models.Model):
    """A sanitized logo, stored once by content hash and served at /branding/assets/<sha256>."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    content_type = models.CharField(max_length=40)
    data = models.BinaryField()
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.content_type} {self.sha256[:12]}"


class Theme(models.Model):
    """A rendered theme: the document every instance receives, identified by its content hash."""

    id = models.BigAutoField(primary_key=True)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="themes")
    version = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)
    document = models.JSONField()
    logo = models.ForeignKey(BrandingAsset, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The current theme of an operator is the one activated last (re-submitting old branding re-activates it).
    activated_at = models.DateTimeField()

    class Meta:
        ordering = ["operator", "-activated_at"]
        constraints = [
            models.UniqueConstraint(fields=["operator", "version"], name="one_theme_version_per_operator"),
            models.UniqueConstraint(fields=["operator", "content_hash"], name="one_theme_per_content"),
        ]

    def __str__(self) -> str:
        return f"{self.operator_id} theme v{self.version} ({self.content_hash[:12]})"


class BrandingRevision(models.Model):
    """One submission of the branding form, validated by a Celery job. The raw logo is dropped after."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="branding_revisions")
    status = models.CharField(max_length=20, choices=RevisionStatus.choices, default=RevisionStatus.PENDING)
    submitted_by = models.CharField(max_length=200, blank=True)
    product_name = models.CharField(max_length=500)
    primary_color = models.CharField(max_length=20)
    background_color = models.CharField(max_length=20)
    support_email = models.CharField(max_length=254, blank=True)
    raw_logo = models.BinaryField(null=True, blank=True)
    # Keep the current logo when no new file was uploaded (and it was not removed).
    keep_logo = models.ForeignKey(BrandingAsset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    errors = models.JSONField(default=list, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    theme = models.ForeignKey(Theme, null=True, blank=True, on_delete=models.SET_NULL, related_name="revisions")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "updated_at"])]

    def __str__(self) -> str:
        return f"branding of {self.operator_id} ({self.status})"


class RolloutJob(models.Model):
    """Rolls one theme out to every instance of its operator; progress committed per instance.

    ``cursor`` is the id of the last tenant processed (tenants are visited in id order), so a
    worker killed anywhere resumes after it; the per-instance check by content hash makes the
    one in flight at the kill harmless to redo.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="rollout_jobs")
    theme = models.ForeignKey(Theme, on_delete=models.CASCADE, related_name="rollouts")
    status = models.CharField(max_length=20, choices=RolloutStatus.choices, default=RolloutStatus.PENDING)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    published = models.PositiveIntegerField(default=0)
    unchanged = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cursor = models.UUIDField(null=True, blank=True)
    error = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["operator"], condition=models.Q(status__in=ACTIVE_ROLLOUT_STATUSES),
                name="one_active_rollout_per_operator",
            ),
        ]
        indexes = [models.Index(fields=["status", "updated_at"])]

    def __str__(self) -> str:
        return f"rollout of {self.theme} ({self.status} {self.done}/{self.total})"

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, round(100 * self.done / self.total))

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_ROLLOUT_STATUSES


class BrandingDeployment(models.Model):
    """The theme an instance has: compared by content hash before publishing again."""

    tenant = models.OneToOneField(Tenant, primary_key=True, on_delete=models.CASCADE, related_name="branding")
    theme = models.ForeignKey(Theme, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    content_hash = models.CharField(max_length=64, blank=True)
    driver = models.CharField(max_length=40, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    publish_count = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id} has {self.content_hash[:12] or 'nothing'}"


__all__ = ["BrandingAsset", "Theme", "BrandingRevision", "RolloutJob", "BrandingDeployment", "RolloutStatus"]
