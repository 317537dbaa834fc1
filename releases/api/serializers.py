"""Shapes of the releases API. The upload is multipart (the wheel as ``file``); the rest is strict JSON."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.strict import JSONString, StrictInput

from ..models import AgentRelease
from ..services import MAX_NOTES_CHARS


class ReleaseUploadInput(StrictInput):
    file = serializers.FileField(help_text="The agent package as a wheel (.whl).")
    sha256 = JSONString(required=False, max_length=71,
                        help_text="The wheel's sha256 (hex, optionally `sha256:`): checked before anything else.")
    notes = JSONString(required=False, allow_blank=True, default="", max_length=MAX_NOTES_CHARS)
    default_config = JSONString(required=False, default="{}",
                                help_text="A JSON object: the configuration tenants get unless they override it.")


class ReleaseOutput(serializers.ModelSerializer):
    kinds = serializers.DictField(child=serializers.CharField(), help_text="Agent kind -> description.")
    default_config = serializers.DictField()

    class Meta:
        model = AgentRelease
        fields = ["id", "version", "distribution", "digest", "filename", "size_bytes", "kinds", "default_config",
                  "notes", "created_by", "created_at"]
