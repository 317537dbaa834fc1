"""Input and output shapes of the egress API. Inputs are strict: an unknown field is a 400."""

from __future__ import annotations

from django.core.validators import RegexValidator
from rest_framework import serializers

from controlplane.pagination import MAX_LIMIT
from controlplane.strict import JSONString, StrictInput, no_final_newline
from egress.choices import DecisionReason, RequestKind
from egress.rules import HOST_PATTERN
from webhooks.api.serializers import StrictQuery, cursor_page

__all__ = ["DecisionOutput", "DecisionQuery", "RuleCreateInput", "RuleOutput", "RuleQuery", "cursor_page"]


class RuleQuery(StrictQuery):
    tenant = serializers.UUIDField(required=False, help_text="Only the rules of this tenant.")
    release = serializers.UUIDField(required=False, help_text="Only the rules of this release.")


class RuleCreateInput(StrictInput):
    # Kept as sent (no trimming): the pattern refuses any whitespace, except that Python's ``$`` also matches before
    # a final newline.
    host = JSONString(max_length=253, trim_whitespace=False,
                      validators=[RegexValidator(HOST_PATTERN, message="not a host name"),
                                  no_final_newline],
                      help_text="`api.example.com`, `*.example.com` (names under it, not itself) or an IPv4 address; "
                                "the port goes in `port`.")
    port = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=65535, default=None,
                                    help_text="Omitted: the web ports, 443 and 80.")
    tenant = serializers.UUIDField(required=False, allow_null=True, default=None,
                                   help_text="Only this customer. Omitted (and no `release`): all your customers.")
    release = serializers.UUIDField(required=False, allow_null=True, default=None,
                                    help_text="Only the customers running (or finishing tasks on) this release.")
    note = JSONString(required=False, allow_blank=True, max_length=200, default="",
                      help_text="Why: 'the model provider', 'payments'.")


class RuleOutput(serializers.Serializer):
    id = serializers.UUIDField()
    host = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    tenant = serializers.UUIDField(source="tenant_id", allow_null=True)
    release = serializers.UUIDField(source="release_id", allow_null=True)
    note = serializers.CharField()
    created_at = serializers.DateTimeField()


class DecisionQuery(StrictQuery):
    cursor = serializers.CharField(required=False, max_length=200,
                                   help_text="Opaque: from a page's `next` or `previous`.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT,
                                     help_text=f"Page size, 1-{MAX_LIMIT} (default 50).")


class DecisionOutput(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    allowed = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=DecisionReason.choices)
    kind = serializers.ChoiceField(choices=RequestKind.choices)
    host = serializers.CharField()
    port = serializers.IntegerField()
    bytes_up = serializers.IntegerField(help_text="Bytes the instance sent.")
    bytes_down = serializers.IntegerField(help_text="Bytes the instance received.")
    duration_ms = serializers.IntegerField()
