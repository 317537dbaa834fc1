"""Shapes of the usage API: the period query (strict) and one ``UsageDay`` row."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.errors import ValidationFailed
from controlplane.pagination import MAX_LIMIT
from controlplane.strict import StrictInput

from ..models import UsageDay
from ..pricing import PriceBook

# The columns of a row, in the CSV export's order (the JSON object has the same names).
COLUMNS = ("tenant", "tenant_slug", "day", "tasks_submitted", "tasks_done", "tasks_failed", "steps_run", "compute_s",
           "messages_in", "messages_out", "effects_committed", "input_tokens", "output_tokens", "tokens_by_model",
           "model_cost_usd",
           "schema_bytes", "object_bytes", "volume_bytes", "storage_unmeasured", "collected_at")


class UsageQuery(StrictInput):
    """``from`` and ``to``: UTC days, both included (ISO dates); pages with ``limit``/``offset``; ``format=csv``."""

    def __init__(self, *args: Any, query: Any = None, **kwargs: Any) -> None:
        if query is not None:
            for key in query:
                if len(query.getlist(key)) > 1:
                    raise ValidationFailed(f"parameter {key} given more than once")
            kwargs["data"] = {k: query.get(k) for k in query}
        super().__init__(*args, **kwargs)

    # ``from`` is a Python keyword: declared under its own name below.
    to = serializers.DateField(required=False, help_text="the last day (UTC) included; default: today")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT)
    offset = serializers.IntegerField(required=False, min_value=0)
    format = serializers.ChoiceField(choices=["json", "csv"], required=False,
                                     help_text="csv: the whole period as text/csv, as `Accept: text/csv` does")


UsageQuery._declared_fields["from"] = serializers.DateField(
    required=False, help_text="the first day (UTC) included; default: the first of `to`'s month")


class UsageDayOutput(serializers.ModelSerializer):
    tenant = serializers.UUIDField(source="tenant_id")
    tenant_slug = serializers.CharField(source="tenant.slug")
    tokens_by_model = serializers.DictField(child=serializers.DictField(child=serializers.IntegerField()),
                                            help_text='{"<model>": {"input": n, "output": n}}')
    model_cost_usd = serializers.SerializerMethodField(
        help_text="the day's model tokens priced at the operator's model prices (its own, else the platform's "
                  "default), in USD, exact (a decimal string); null when a model used that day has no price")
    storage_unmeasured = serializers.DictField(
        child=serializers.CharField(), help_text='why a storage figure is null: {"volume_bytes": "the k8s-pvc driver '
                                                 'cannot measure its bytes"}')

    class Meta:
        model = UsageDay
        fields = COLUMNS

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_model_cost_usd(self, row: UsageDay) -> str | None:
        prices: PriceBook | None = self.context.get("prices")
        cost = prices.day_cost(row.tokens_by_model or {}) if prices is not None else None
        return format(cost.normalize(), "f") if cost is not None else None
