"""Credential API shapes. The value is accepted (write-only) and never part of any output."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.strict import JSONBoolean, JSONString, StrictInput
from vault.choices import CredentialState
from vault.models import Credential
from vault.selectors import credential_state
from vault.services import MAX_VALUE_CHARS


class CredentialPutInput(StrictInput):
    value = JSONString(
        write_only=True, max_length=MAX_VALUE_CHARS, trim_whitespace=False, style={"input_type": "password"},
        help_text="The secret. Write-only: no endpoint ever returns it.",
    )
    one_time = JSONBoolean(
        default=False, help_text="Delivered to the instance once, then consumed."
    )


class CredentialOutput(serializers.ModelSerializer):
    version = serializers.IntegerField(source="current_version", help_text="Current version number.")
    state = serializers.SerializerMethodField()

    class Meta:
        model = Credential
        fields = ["name", "version", "one_time", "state", "created_at", "updated_at", "last_used_at",
                  "revoked_at", "consumed_at"]

    @extend_schema_field(serializers.ChoiceField(choices=CredentialState.choices))
    def get_state(self, credential: Credential) -> str:
        return credential_state(credential)
