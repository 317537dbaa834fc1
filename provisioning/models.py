"""The committed record of every external effect of provisioning, and of workflow progress.

A ``ProvisionedResource`` row is written once per (tenant, kind): whatever a worker
crash does, a re-run finds it and ``ensure``s the same external object again.
"""

from __future__ import annotations

import uuid

from django.db import models

from provisioning.choices import (
    DatabaseServerState,
    InstanceStatus,
    RecoveryOutcome,
    RecoveryReason,
    ResourceKind,
    ResourceStatus,
    StepStatus,
    WakeOutcome,
    WorkflowKind,
    WorkflowStatus,
)
from tenants.models import Tenant


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


class DatabaseServer(models.Model):
    """A PostgreSQL server (one database on it) that holds tenant schemas; each tenant is placed on one.

    ``dsn`` never carries a password: the server named by ``TENANT_DATABASE_URL`` takes the setting's, any other
    takes what libpq finds itself (``passfile`` in the DSN, ``PGPASSFILE``), so no secret sits in this table.
    ``from_settings``: created from ``TENANT_DATABASE_URL``; when the setting names another server, that record
    goes to draining and a new one is made, so existing tenants keep reading their own server (their data is
    there) and only new tenants follow the setting.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.SlugField(max_length=60, unique=True)
    dsn = models.TextField(help_text="libpq URL or key=value string of the tenant database, without a password")
    pooler_dsn = models.TextField(
        blank=True, help_text="a PgBouncer (transaction mode) in front of this server: instances connect there")
    standby_dsn = models.TextField(blank=True, help_text="a streaming standby of this server, for failover")
    capacity = models.PositiveIntegerField(default=1000, help_text="at most this many tenants are placed here")
    state = models.CharField(max_length=20, choices=DatabaseServerState.choices, default=DatabaseServerState.ACTIVE)
    from_settings = models.BooleanField(default=False, editable=False)
    # The authentication posture seen when a tenant was last provisioned here ("scram", "weak", "insecure-override").
    auth = models.CharField(max_length=30, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


class DatabasePlacement(models.Model):
    """Which server holds the tenant's schema: read back for every connection to it, written by placement."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True,
                                  related_name="database_placement")
    server = models.ForeignKey(DatabaseServer, on_delete=models.PROTECT, related_name="placements")
    placed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.tenant_id} on {self.server}"


class DatabaseMove(models.Model):
    """One move of a tenant's schema between servers, driven by its ``WorkflowRun`` (kind ``move``).

    The tenant's placement changes only in the ``switch`` step, after the copy was verified; until then every
    reader and the instance keep the source, and the source is dropped only after the switch.
    """

    run = models.OneToOneField("WorkflowRun", on_delete=models.CASCADE, primary_key=True, related_name="move")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="database_moves")
    source = models.ForeignKey(DatabaseServer, on_delete=models.PROTECT, related_name="moves_out")
    target = models.ForeignKey(DatabaseServer, on_delete=models.PROTECT, related_name="moves_in")
    # Whether the instance was running when the move drained it (only then is it started again).
    was_running = models.BooleanField(null=True)
    # Per table: rows and an order-independent checksum, as counted on the source (and matched on the target).
    verified = models.JSONField(default=dict, blank=True)
    copied_bytes = models.BigIntegerField(default=0)
    drained_at = models.DateTimeField(null=True, blank=True)
    switched_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"move of {self.tenant_id}: {self.source} -> {self.target}"


class AgentInstance(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="instance")
    status = models.CharField(max_length=20, choices=InstanceStatus.choices, default=InstanceStatus.PENDING)
    driver = models.CharField(max_length=40, blank=True)
    endpoint = models.CharField(max_length=300, blank=True)
    # Hash of the instance's token for the internal endpoints; the token itself is only in its env/Secret.
    token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    status_reason = models.TextField(blank=True)
    # Exponential backoff between automatic recoveries of this instance.
    next_recovery_at = models.DateTimeField(null=True, blank=True)
    # When the drift check last observed this instance's resources: each run takes the least recently
    # checked, so the whole fleet is covered in turn (ordering by updated_at, which heartbeats never bump,
    # used to check the same 500 every minute).
    drift_checked_at = models.DateTimeField(null=True, blank=True)
    # The newest activity the control plane itself saw: an inbox item accepted for it, its start or wake. The
    # idle check (provisioning/fleet/sleep.py) reads this first, then the tenant's schema, before putting it to sleep.
    last_activity_at = models.DateTimeField(null=True, blank=True)
    # When its stop for idleness finished; NULL while it is still stopping (status asleep) and while awake.
    asleep_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["drift_checked_at"], name="instance_drift_window")]

    def __str__(self) -> str:
        return f"instance of {self.tenant}"


class InstanceWake(models.Model):
    """One wake of an asleep instance: what woke it, when it was accepted, when it was up and read back, and
    when the instance took the first waiting item. A storm of messages makes one row (one boot)."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="wakes")
    instance = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="wakes")
    trigger = models.CharField(max_length=40, help_text="the inbox item's kind (message, task, ...) or 'sweep'")
    requested_at = models.DateTimeField(help_text="when the item that woke it was accepted")
    ready_at = models.DateTimeField(null=True, blank=True, help_text="when the instance was up and read back")
    delivered_at = models.DateTimeField(null=True, blank=True, help_text="when it took the first waiting item")
    outcome = models.CharField(max_length=20, choices=WakeOutcome.choices, default=WakeOutcome.PENDING)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["outcome", "requested_at"], name="wake_outcome_requested")]

    def __str__(self) -> str:
        return f"wake of {self.tenant_id} ({self.outcome})"

    @property
    def boot_s(self) -> float | None:
        """Accepted -> up and read back."""
        return None if self.ready_at is None else (self.ready_at - self.requested_at).total_seconds()

    @property
    def delivery_s(self) -> float | None:
        """Accepted -> the instance took the item (its reply starts then)."""
        return None if self.delivered_at is None else (self.delivered_at - self.requested_at).total_seconds()


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


class RecoveryEvent(models.Model):
    """One recovery of one instance: why, when each phase happened, from which checkpoint, the outcome."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="recoveries")
    instance = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="recoveries")
    run = models.OneToOneField(WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="recovery_event")
    reason = models.CharField(max_length=20, choices=RecoveryReason.choices)
    detail = models.TextField(blank=True)
    detected_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    from_checkpoint = models.CharField(max_length=100, blank=True)
    steps_lost = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=RecoveryOutcome.choices, default=RecoveryOutcome.PENDING)
    repaired = models.JSONField(default=list, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-detected_at"]
        indexes = [models.Index(fields=["instance", "detected_at"]), models.Index(fields=["outcome"])]

    def __str__(self) -> str:
        return f"{self.reason} recovery of {self.tenant} ({self.outcome})"

    @property
    def time_to_recover_s(self) -> float | None:
        if self.resumed_at is None:
            return None
        return (self.resumed_at - self.detected_at).total_seconds()


class RollingRestart(models.Model):
    """A planned restart of every running instance (e.g. a runtime upgrade), a bounded number at a time."""

    id = models.BigAutoField(primary_key=True)
    status = models.CharField(max_length=20, choices=WorkflowStatus.choices, default=WorkflowStatus.PENDING)
    concurrency = models.PositiveIntegerField(default=1)
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"rolling restart {self.pk} ({self.status})"


class RollingRestartItem(models.Model):
    id = models.BigAutoField(primary_key=True)
    rollout = models.ForeignKey(RollingRestart, on_delete=models.CASCADE, related_name="items")
    instance = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="planned_restarts")
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    clean_shutdown = models.BooleanField(null=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["rollout", "id"]
        constraints = [models.UniqueConstraint(fields=["rollout", "instance"], name="one_restart_per_rollout")]

    def __str__(self) -> str:
        return f"restart of {self.instance_id} ({self.status})"


class InstanceIdentity(models.Model):
    """The numeric OS identity of a tenant's sandboxed local instance: uid = gid = ``LOCAL_INSTANCE_UID_BASE + id``.

    No /etc/passwd entry: ``useradd --system`` ran out at ~880 tenants (system uids 100-999) and reissued a freed
    uid within minutes, to a new tenant who then owned whatever the old one left on disk. The id comes from this
    table's sequence, which never goes back, so a uid is never issued twice on a control plane, whatever became of
    its tenant; the row stays after deprovisioning (``released_at``) to say whose it was. Not a foreign key: the
    record must outlive the tenant row.
    """

    tenant_id = models.UUIDField(unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"identity {self.pk} of {self.tenant_id}"
