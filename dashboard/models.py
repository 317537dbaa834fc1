"""The staff dashboard's own rows: per-action permissions and the samples its history charts draw.

Permissions: viewing needs ``is_staff``; each action needs its own permission below (superusers have
all). Grant them to a group such as "on-call" in the Django admin.
Samples: heartbeat age and fleet status are current values elsewhere; these rows are their history.
"""

from __future__ import annotations

from django.db import models


class DashboardPermissions(models.Model):
    """No table: a holder for the permission rows."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("retry_workflow", "Can retry a failed workflow step"),
            ("restart_instance", "Can restart an agent instance"),
            ("kill_instance", "Can kill an agent instance"),
            ("suspend_tenant", "Can suspend or resume a tenant"),
            ("deprovision_tenant", "Can deprovision a tenant"),
            ("rotate_keys", "Can rotate a tenant's data keys"),
            ("talk_to_agent", "Can send messages to a tenant's agent"),
            ("decide_effect", "Can decide an effect in doubt (performed, not performed, perform now)"),
            ("pause_schedule", "Can pause or resume a tenant's schedule"),
        ]

    def __str__(self) -> str:
        return "dashboard permissions"


class FleetSample(models.Model):
    """How many instances were in each health state at one moment: the fleet-status-over-time chart.

    Nothing else stores this history (instances hold only their current status), so the sampling task
    (``dashboard.sampling``) writes one row a minute and prunes rows older than the retention.
    """

    id = models.BigAutoField(primary_key=True)
    taken_at = models.DateTimeField(db_index=True)
    # {label: count} with the labels of ``provisioning.recovery.health`` (healthy, stale, recovering, ...), so
    # the chart says what the tenant pages said at that moment; a label nobody had is left out.
    counts = models.JSONField(default=dict)

    class Meta:
        ordering = ["taken_at"]

    def __str__(self) -> str:
        return f"fleet at {self.taken_at:%Y-%m-%d %H:%M}"


class HeartbeatSample(models.Model):
    """One instance's heartbeat age at one moment: the heartbeat-age history on its tenant page."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="heartbeat_samples")
    taken_at = models.DateTimeField()
    age_s = models.FloatField(null=True, blank=True)  # None: no heartbeat received yet
    label = models.CharField(max_length=20)  # the health label at that moment (healthy, stale, recovering, ...)

    class Meta:
        ordering = ["taken_at"]
        # The chart reads one tenant's window; pruning reads by time alone.
        indexes = [models.Index(fields=["tenant", "taken_at"]), models.Index(fields=["taken_at"])]

    def __str__(self) -> str:
        return f"heartbeat of {self.tenant_id} at {self.taken_at:%H:%M}"
