"""Output serializers for provisioning's API: recovery events."""

from __future__ import annotations

from rest_framework import serializers

from provisioning.models import RecoveryEvent


class RecoveryEventOutput(serializers.ModelSerializer):
    time_to_recover_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = RecoveryEvent
        fields = ["id", "reason", "detail", "outcome", "detected_at", "stopped_at", "resumed_at",
                  "from_checkpoint", "steps_lost", "repaired", "finished_at", "time_to_recover_s"]
