"""Shapes of the internal endpoints. The delivery output is the one place a value leaves the vault."""

from __future__ import annotations

from rest_framework import serializers


class HeartbeatInput(serializers.Serializer):
    task = serializers.CharField(max_length=200, allow_null=True, allow_blank=True, required=False)
    step = serializers.CharField(max_length=200, allow_null=True, allow_blank=True, required=False)
    checkpoint = serializers.CharField(max_length=200, allow_null=True, allow_blank=True, required=False)
    progress_seq = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    status = serializers.CharField(max_length=40, allow_null=True, allow_blank=True, required=False)
    # Why the instance is not ready (e.g. its agent package failed to import); shown on the dashboard.
    error = serializers.CharField(max_length=500, allow_null=True, allow_blank=True, required=False)
