"""The committed record of every external effect of provisioning, and of workflow progress.

A ``ProvisionedResource`` row is written once per (tenant, kind): whatever a worker
crash does, a re-run finds it and ``ensure``s the same external object again.
"""

from __future__ import annotations

import uuid

from django.db import models

from tenants.models import Tenant

from .choices import InstanceStatus, ResourceKind, ResourceStatus, StepStatus, WorkflowKind, WorkflowStatus


class ProvisionedResource(models.Model):
    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="resources")
    kind = models.CharField(max_length=20, choices=ResourceKind.choices)
    driver = models.CharField(max_length=40)
    external_id = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=20, choices=ResourceStatus.choices, default=ResourceStatus.PROVISIONING)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "kind"], name="one_resource_per_kind")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.external_id}"


class AgentInstance(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="instance")
    status = models.CharField(max_length=20, choices=InstanceStatus.choices, default=InstanceStatus.PENDING)
    driver = models.CharField(max_length=40, blank=True)
    endpoint = models.CharField(max_length=300, blank=True)
    # Hash of the instance's token for the internal endpoints; the token itself is only in its env/Secret.
    token_hash = models.CharField(max_length=64, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"instance of {self.tenant}"


class WorkflowRun(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="workflow_runs")
    kind = models.CharField(max_length=20, choices=WorkflowKind.choices)
    status = models.CharField(max_length=20, choices=WorkflowStatus.choices, default=WorkflowStatus.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "updated_at"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.tenant} ({self.status})"


class WorkflowStep(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=40)
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    output = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_step_name_per_run")]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"
