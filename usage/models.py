"""``UsageDay``: one tenant's usage on one UTC day, the row an operator's bill is made from.

Every count is recomputed whole from the instance's own tables each time the day is collected (never added to),
so collecting a day twice, or after a crash halfway, writes the same row: exactly once per event by
construction. Storage is a measurement, not a count: the latest one taken while the day was current.
"""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant


class UsageDay(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField()
    tasks_submitted = models.PositiveIntegerField(default=0)
    tasks_done = models.PositiveIntegerField(default=0)
    tasks_failed = models.PositiveIntegerField(default=0)
    steps_run = models.PositiveIntegerField(default=0)
    compute_s = models.FloatField(default=0.0, help_text="sum of the step attempts' durations that ended that day")
    messages_in = models.PositiveIntegerField(default=0, help_text="the customer's messages to the agent")
    messages_out = models.PositiveIntegerField(default=0, help_text="the agent's replies")
    effects_committed = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    tokens_by_model = models.JSONField(default=dict, blank=True, help_text='{"model": {"input": n, "output": n}}')
    schema_bytes = models.BigIntegerField(null=True, blank=True, help_text="null: not measured that day")
    object_bytes = models.BigIntegerField(null=True, blank=True,
                                          help_text="bytes under the tenant's object-store prefix; null: not measured")
    volume_bytes = models.BigIntegerField(null=True, blank=True,
                                          help_text="bytes of files in the tenant's volume; null: not measured")
    # Why a storage figure of the day is null: {"volume_bytes": "the k8s-pvc driver does not support ..."}.
    storage_unmeasured = models.JSONField(default=dict, blank=True)
    collected_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "day"], name="usage_day_one_per_tenant_and_day")]
        indexes = [models.Index(fields=["day", "tenant"], name="usage_day_by_day")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day}"
