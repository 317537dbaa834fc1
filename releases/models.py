"""An operator's agent release: one validated version of its agent package, usable by its tenants."""

from __future__ import annotations

import uuid

from django.db import models

from tenants.models import Operator


class AgentRelease(models.Model):
    """Registered only once validated (installs, imports, declares its kinds): nothing half-registered.

    The artifact is the wheel itself, kept under its content digest; ``kinds`` are what its entry points
    provide, read by ``agent_runtime.host.probe`` in a separate process, never by the control plane.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="releases")
    version = models.CharField(max_length=100)
    distribution = models.CharField(max_length=200)
    digest = models.CharField(max_length=71, help_text="sha256:<hex> of the wheel")
    filename = models.CharField(max_length=300)
    size_bytes = models.BigIntegerField()
    artifact_key = models.CharField(max_length=500, help_text="where the wheel is kept, relative to the store")
    kinds = models.JSONField(default=dict, help_text="agent kind -> description")
    default_config = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["operator", "version"], name="one_release_per_version")]

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} ({self.operator.slug})"
