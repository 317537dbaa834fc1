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


class ModelPrice(models.Model):
    """What a model's tokens cost, in USD per million input and output tokens: the trace view's cost of each model
    call and the usage export's cost per customer per day.

    Per operator, with a platform default: a white-label operator bills its customers at its own rates (and may pay
    a different provider price), so its row wins for its customers; a row without an operator is the price staff
    set for everyone else. Another operator's row never applies. A model with no row has no cost: the screens say
    "—" rather than guess. The model is matched exactly as the span names it (``gen_ai.response.model``, then
    ``gen_ai.request.model``).
    """

    operator = models.ForeignKey("tenants.Operator", on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="model_prices", help_text="empty: the default for every operator")
    model = models.CharField(max_length=200, help_text="exactly as the spans name it, e.g. gpt-4o-mini-2024-07-18")
    input_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6,
                                             help_text="USD per million input (prompt) tokens")
    output_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6,
                                              help_text="USD per million output (completion) tokens")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operator", "model"], name="model_price_one_per_operator_and_model"),
            models.UniqueConstraint(fields=["model"], condition=models.Q(operator__isnull=True),
                                    name="model_price_one_default_per_model"),
            models.CheckConstraint(condition=models.Q(input_usd_per_mtok__gte=0, output_usd_per_mtok__gte=0),
                                   name="model_price_not_negative"),
        ]
        ordering = ("model", "operator_id")

    def __str__(self) -> str:
        return f"{self.model} ({self.operator_id or 'default'})"
