"""Serializers the whole operator API shares: the empty body of an action, and the plans a tenant can be on.

The tenant's own inputs and outputs are in ``provisioning/api/serializers.py`` (a tenant is shown with its
resources and instance).
"""

from __future__ import annotations

from rest_framework import serializers

from controlplane.strict import StrictInput
from tenants.models import Plan


class NoInput(StrictInput):
    """Actions that take no body: an empty one or `{}`; any field is a 400."""


class PlanOutput(serializers.ModelSerializer):
    class Meta:
        model = Plan
        fields = ["slug", "name", "description", "max_messages_per_day", "max_tasks_per_day", "max_tasks_per_month",
                  "max_tokens_per_month"]
