"""Input and output shapes of the conversation API. Inputs are strict: an unknown field is a 400.

Meaning (thread names, sizes, scopes) is validated in services; instance answers are passed through
as the instance API documents them (docs/instance-api.md), so their shapes here are loose.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.openapi import NUL_FREE_OBJECT
from controlplane.strict import JSONInteger, JSONString, StrictInput
from conversations.choices import (
    CUSTOMER_TOKEN_SCOPES,
    CUSTOMER_TOKEN_TTL_DEFAULT_S,
    CUSTOMER_TOKEN_TTL_MAX_S,
    CUSTOMER_TOKEN_TTL_MIN_S,
    EffectDecision,
    InboxKind,
    InboxStatus,
    ThreadPolicy,
)
from conversations.services import KIND_RE, MAX_MESSAGE_CHARS
from tenants.end_users import end_user_field

_END_USER_HELP = ("The end user of the customer this acts for (your opaque id, 1-128 characters of A-Z a-z 0-9 . _ "
                  ": @ + -): the task uses that end user's connected accounts (docs/connections.md). A customer "
                  "token bound to an end user sets it (naming another is a 400).")


class MessageInput(StrictInput):
    # Length and NUL checks are the service's; the field only insists on a string, kept as sent.
    content = JSONString(trim_whitespace=False, help_text=f"1 to {MAX_MESSAGE_CHARS} characters.")
    end_user = end_user_field(_END_USER_HELP)
    policy = serializers.ChoiceField(
        choices=ThreadPolicy.choices, required=False,
        help_text="What this message does to the thread's run that is still going; overrides the thread's policy "
                  "for this message only (default: the thread's, else `enqueue`). `reject`: 409 `thread-busy` naming "
                  "the running task; `interrupt`: that run stops at its next step boundary (`interrupted`), keeping "
                  "what it committed; `rollback`: that run is discarded (`rolled_back`) unless it has an effect, "
                  "then 409 `rollback-refused` naming the effect.")


class ThreadPolicyInput(StrictInput):
    policy = serializers.ChoiceField(choices=ThreadPolicy.choices, help_text="The thread's policy for a message "
                                     "that arrives while its previous run is still going.")


class ThreadOutput(serializers.Serializer):
    thread = serializers.CharField()
    policy = serializers.ChoiceField(choices=ThreadPolicy.choices)


@extend_schema_field(NUL_FREE_OBJECT)
class _JSONObject(serializers.DictField):
    """A free JSON object; a NUL anywhere in it is refused by the service (jsonb cannot store it)."""


class TaskInput(StrictInput):
    kind = JSONString(max_length=100, validators=[RegexValidator(KIND_RE)],
                      help_text="An agent kind the instance runs.")
    params = _JSONObject(required=False, default=dict)
    end_user = end_user_field(_END_USER_HELP)


class DecisionInput(StrictInput):
    decision = serializers.ChoiceField(choices=EffectDecision.choices)
    result = _JSONObject(required=False, default=dict,
                         help_text="With `performed`: what the provider answered, if known.")
    note = JSONString(required=False, default="", allow_blank=True, max_length=2000)


class EmptyInput(StrictInput):
    pass


class CustomerTokenInput(StrictInput):
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=list(CUSTOMER_TOKEN_SCOPES)),
                                   allow_empty=False, min_length=1)
    ttl_s = JSONInteger(required=False, default=CUSTOMER_TOKEN_TTL_DEFAULT_S,
                                     min_value=CUSTOMER_TOKEN_TTL_MIN_S, max_value=CUSTOMER_TOKEN_TTL_MAX_S)
    end_user = end_user_field("Bind the token to one end user of the customer (your opaque id): its messages "
                              "and tasks act for that end user, and it connects and sees only that end "
                              "user's accounts (docs/connections.md).")


class InboxItemOutput(serializers.Serializer):
    id = serializers.UUIDField(help_text="The message or task id the instance sees.")
    kind = serializers.ChoiceField(choices=InboxKind.choices)
    status = serializers.ChoiceField(choices=InboxStatus.choices,
                                     help_text="`pending`: accepted and waiting for the instance.")
    thread = serializers.CharField(allow_blank=True)
    attempts = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)


class MessageSendOutput(serializers.Serializer):
    inbox = InboxItemOutput()
    message = serializers.JSONField(allow_null=True, help_text="The stored user message (null while pending).")
    task = serializers.JSONField(allow_null=True, help_text="The task answering it (null while pending).")
    reply_url = serializers.CharField(help_text="Server-sent events of the reply.")


class InstanceAnswerOutput(serializers.Serializer):
    """An instance API answer, passed through (see docs/instance-api.md)."""

    inbox = InboxItemOutput(required=False)


class CustomerTokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="ctk_...: shown once, never again.")
    prefix = serializers.CharField()
    tenant = serializers.UUIDField()
    scopes = serializers.ListField(child=serializers.CharField())
    end_user = serializers.CharField(allow_null=True)
    expires_at = serializers.DateTimeField()


# Unbound, so no serializer is built per call (its fields are deep-copied per instance: ``inbox_item_data``).
_WHEN = serializers.DateTimeField()


def inbox_item_data(item: Any) -> dict[str, Any]:
    """``InboxItemOutput``'s representation of ``item``, built without instantiating the serializer: each instance
    deep-copies its declared fields, about a tenth of a message's CPU in the web tier (issue 39, profiled under
    gunicorn). The schema still comes from ``InboxItemOutput``; a test keeps the two equal."""
    return {"id": str(item.id), "kind": str(item.kind), "status": str(item.status), "thread": str(item.thread),
            "attempts": int(item.attempts), "created_at": _WHEN.to_representation(item.created_at),
            "delivered_at": _WHEN.to_representation(item.delivered_at)}


class MonthlyLimitOutput(serializers.Serializer):
    """One of the plan's monthly limits and this month's usage against it."""

    limit = serializers.CharField(source="field", help_text="max_tasks_per_month or max_tokens_per_month")
    limit_value = serializers.IntegerField(source="limit", allow_null=True, help_text="null: unlimited")
    used = serializers.IntegerField(help_text="tasks: counted in the inbox (messages included); tokens: collected")
    reached = serializers.BooleanField(help_text="new tasks and messages are refused (429) until resets_at")
    resets_at = serializers.DateTimeField(help_text="the first instant of next month (UTC)")


class UsageLimitsOutput(serializers.Serializer):
    tenant = serializers.UUIDField()
    plan = serializers.CharField()
    limits = MonthlyLimitOutput(many=True)
