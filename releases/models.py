"""An operator's agent release: one validated version of its agent package, usable by its tenants."""

from __future__ import annotations

import uuid

from django.db import models

from tenants.models import Operator, Tenant

from .choices import ACTIVE_ROLLOUT_STATUSES, ItemStatus, RolloutStatus


class AgentRelease(models.Model):
    """Registered only once validated: nothing half-registered. Its artifact is one of two, by profile.

    Local profile: a wheel, kept under its content digest; ``kinds`` are what its entry points provide, read by
    ``agent_runtime.host.probe`` in a separate process, never by the control plane. Kubernetes profile: a
    container ``image`` pinned by digest, held by the operator's registry; ``kinds`` are what the operator
    declares (the control plane never pulls or runs the image; the instance's boot says what really loads).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="releases")
    version = models.CharField(max_length=100)
    distribution = models.CharField(max_length=255, help_text="the wheel's distribution, or the image's repository")
    digest = models.CharField(max_length=71,
                              help_text="sha256:<hex> of the wheel, or the digest the image is pinned by")
    image = models.CharField(max_length=500, blank=True,
                             help_text="the image as instances pull it, <registry>/<repository>@sha256:<hex>; "
                                       "empty for a wheel")
    filename = models.CharField(max_length=300, blank=True, help_text="the wheel's file name; empty for an image")
    size_bytes = models.BigIntegerField(help_text="the wheel's size; 0 for an image (its registry holds it)")
    artifact_key = models.CharField(max_length=500, blank=True,
                                    help_text="where the wheel is kept, relative to the store; empty for an image")
    kinds = models.JSONField(default=dict, help_text="agent kind -> description")
    default_config = models.JSONField(default=dict, blank=True)
    config_schema = models.JSONField(null=True, blank=True,
                                     help_text="the agents' configuration schemas merged into one object schema "
                                               "(null: any JSON object)")
    connections = models.JSONField(default=list, blank=True,
                                   help_text="the providers whose connected accounts the agents declare "
                                             "(Agent(connections=...)), sorted: the only ones its instances get")
    egress = models.JSONField(default=list, blank=True,
                              help_text="the internet hosts the agents declare (Agent(egress=...)), sorted: the "
                                        "egress proxy lets the tenants running this release reach them (443, 80)")
    notes = models.TextField(blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["operator", "version"], name="one_release_per_version")]

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} ({self.operator.slug})"


class DefaultRelease(models.Model):
    """The release an operator's new customers start on; a rollout that succeeds makes its release the default.

    Changing the default never restarts anyone: running tenants move only through a rollout or a pin.
    """

    operator = models.OneToOneField(Operator, on_delete=models.CASCADE, primary_key=True,
                                    related_name="default_release")
    release = models.ForeignKey(AgentRelease, on_delete=models.PROTECT, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"default of {self.operator_id}: {self.release_id}"


class ReleaseAssignment(models.Model):
    """Which release a tenant runs: its instance loads exactly this one (none: the runtime's installed agents).

    ``pinned`` tenants stay on their release whatever rollouts do; the others follow the operator's
    default as rollouts move it. Written before the instance restarts, so a worker killed in between
    leaves the record saying what the next start must load.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="release_assignment")
    release = models.ForeignKey(AgentRelease, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    pinned = models.BooleanField(default=False)
    # The releases it ran before, newest first (ids; at most RELEASE_RETAINED_PER_TENANT): the instance keeps them
    # loadable so a task finishes on the release it started on (docs/releases.md).
    retained = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.tenant_id} runs {self.release_id or 'the runtime agents'}{' (pinned)' if self.pinned else ''}"


class Rollout(models.Model):
    """Moving an operator's unpinned tenants to one release: a canary wave, then waves, each under a health gate.

    Progress is committed per tenant (``RolloutItem``), so a killed worker resumes where it was: no tenant is
    upgraded twice or skipped. A wave that fails its gate rolls every upgraded tenant back to its previous
    release; the tenants of later waves are never touched.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="rollouts")
    release = models.ForeignKey(AgentRelease, on_delete=models.PROTECT, related_name="rollouts")
    # The operator's default when the rollout began: what a rollback of a succeeded rollout restores.
    previous_default = models.ForeignKey(AgentRelease, null=True, blank=True, on_delete=models.PROTECT,
                                         related_name="+")
    status = models.CharField(max_length=20, choices=RolloutStatus.choices, default=RolloutStatus.RUNNING)
    canary = models.PositiveIntegerField(help_text="tenants in the first wave")
    wave_size = models.PositiveIntegerField()
    soak_s = models.PositiveIntegerField(help_text="how long each wave must stay healthy before the next")
    reason = models.TextField(blank=True, help_text="why it stopped, rolled back or failed")
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(
            fields=["operator"], condition=models.Q(status__in=ACTIVE_ROLLOUT_STATUSES),
            name="one_active_release_rollout_per_operator")]

    def __str__(self) -> str:
        return f"rollout of {self.release_id} ({self.status})"


class RolloutItem(models.Model):
    """One tenant's place in a rollout: its wave, the release it ran before, and how far it got."""

    id = models.BigAutoField(primary_key=True)
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="items")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    wave = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=ItemStatus.choices, default=ItemStatus.PENDING)
    from_release = models.ForeignKey(AgentRelease, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # Times the instance was really restarted onto the new release (a resumed worker must not add one).
    upgrades = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="its old instance was down")
    upgraded_at = models.DateTimeField(null=True, blank=True)
    rolled_back_at = models.DateTimeField(null=True, blank=True)
    # Downtime of the upgrade: the old release's last step finished -> the new release's first step done.
    downtime_ms = models.PositiveIntegerField(null=True, blank=True)
    # Tasks that moved from the release they started on to this one since the upgrade (their agent declares its
    # steps compatible, or an operator retried them): counted by the health gate, shown with the wave.
    tasks_crossed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["wave", "id"]
        constraints = [models.UniqueConstraint(fields=["rollout", "tenant"], name="one_rollout_item_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant_id} in wave {self.wave} ({self.status})"


class TenantAgentConfig(models.Model):
    """A customer's overrides of its release's agent configuration (the effective one: defaults, then these).

    Kept across releases: validated against the tenant's release schema when written; a property a later release
    no longer declares is still stored and shown, and rejected only by the next write. Credential properties hold
    names of the tenant's vault credentials, never values.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="agent_config")
    overrides = models.JSONField(default=dict, blank=True)
    updated_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"agent configuration of {self.tenant_id}"
