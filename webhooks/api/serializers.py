"""Input and output shapes of the events and webhooks API. Inputs are strict: an unknown field is a 400."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.errors import ValidationFailed
from controlplane.hostpaths import PublicTextField
from controlplane.pagination import MAX_LIMIT
from controlplane.strict import JSONBoolean, JSONString, StrictInput
from controlplane.urlform import URLFormValidator
from webhooks.choices import EVENT_TYPE_FILTERS, DeliveryStatus, EndpointStatus, EventType
from webhooks.services import MAX_URL_CHARS, event_payload, event_types_validate


class StrictQuery(StrictInput):
    """Query parameters, each at most once; unknown ones are a 400 naming them."""

    def __init__(self, *args: Any, query: Any = None, **kwargs: Any) -> None:
        if query is not None:
            for key in query:
                if len(query.getlist(key)) > 1:
                    raise ValidationFailed(f"parameter {key} given more than once")
            kwargs["data"] = {k: query.get(k) for k in query}
        super().__init__(*args, **kwargs)


class _EventTypeFilter(serializers.ChoiceField):
    """One of ``EVENT_TYPE_FILTERS``, as a JSON string; refused with the service's message naming it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=EVENT_TYPE_FILTERS, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return event_types_validate([data])[0]


class EventQuery(StrictQuery):
    type = serializers.ChoiceField(choices=EVENT_TYPE_FILTERS, required=False,
                                   help_text="An event type, or `<prefix>.*` (e.g. `tenant.*`).")
    tenant = serializers.UUIDField(required=False, help_text="Only this tenant's events.")
    created_after = serializers.DateTimeField(required=False, help_text="ISO 8601; inclusive.")
    created_before = serializers.DateTimeField(required=False, help_text="ISO 8601; exclusive.")
    cursor = serializers.CharField(required=False, max_length=200,
                                   help_text="Opaque: from a page's `next` or `previous`.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT,
                                     help_text=f"Page size, 1-{MAX_LIMIT} (default 50).")

    def validate_type(self, value: str) -> str:
        event_types_validate([value])
        return value


class DeliveryQuery(StrictQuery):
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)
    cursor = serializers.CharField(required=False, max_length=200,
                                   help_text="Opaque: from a page's `next` or `previous`.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT,
                                     help_text=f"Page size, 1-{MAX_LIMIT} (default 50).")


class EventOutput(serializers.Serializer):
    id = serializers.CharField(help_text="`evt_...`: stable; the `webhook-id` header of its deliveries.")
    object = serializers.CharField(default="event")
    type = serializers.ChoiceField(choices=EventType.choices)
    created_at = serializers.DateTimeField()
    tenant = serializers.UUIDField(allow_null=True)
    data = serializers.DictField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return event_payload(instance)


# The form of a URL the service can accept (``webhooks.targets.target_check``): https (http too where
# WEBHOOK_ALLOW_HTTP), a host, no credentials, a port 1-65535. Whether the host resolves to a public address
# no schema can say: that stays a 400 with the reason.
URL_VALIDATOR = URLFormValidator(allow_http_setting="WEBHOOK_ALLOW_HTTP",
                                 message="url must be https://<host>[:port][/path] without credentials")


class EndpointCreateInput(StrictInput):
    url = JSONString(max_length=MAX_URL_CHARS, validators=[URL_VALIDATOR],
                     help_text="https; must resolve to a public address.")
    description = JSONString(required=False, allow_blank=True, max_length=200, default="")
    event_types = serializers.ListField(child=_EventTypeFilter(), required=False, default=list,
                                        max_length=100, help_text="Empty: every type. Exact types or `<prefix>.*`.")


class EndpointUpdateInput(StrictInput):
    url = JSONString(required=False, max_length=MAX_URL_CHARS, validators=[URL_VALIDATOR])
    description = JSONString(required=False, allow_blank=True, max_length=200)
    event_types = serializers.ListField(child=_EventTypeFilter(), required=False, max_length=100)
    is_active = JSONBoolean(required=False, help_text="false: no new deliveries until set true again.")


class EndpointOutput(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField()
    description = serializers.CharField()
    event_types = serializers.ListField(child=serializers.CharField())
    is_active = serializers.BooleanField()
    status = serializers.ChoiceField(choices=EndpointStatus.choices,
                                     help_text="`failing` once a delivery exhausted its retries; a success clears it.")
    failing_since = serializers.DateTimeField(allow_null=True)
    last_success_at = serializers.DateTimeField(allow_null=True)
    secret_hint = serializers.CharField(help_text="The secret's last characters; the secret is shown only once.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EndpointCreatedOutput(EndpointOutput):
    secret = serializers.CharField(help_text="The Standard Webhooks signing secret (`whsec_` + base64 of 32 "
                                             "random bytes). Shown in this response only.")


class AttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    attempted_at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    error = PublicTextField()
    response_excerpt = serializers.CharField(help_text="The start of the receiver's answer.")
    request_body = serializers.CharField(help_text="The JSON body posted, byte for byte (what the signature "
                                                   "covers); empty for attempts made before it was kept.")
    response_body = serializers.CharField(help_text="The receiver's answer: its first `WEBHOOK_LOG_RESPONSE_BYTES` "
                                                    "bytes as UTF-8 (invalid bytes and NUL replaced).")
    response_truncated = serializers.BooleanField(help_text="The answer was longer than what is kept.")
    response_headers = serializers.DictField(child=serializers.CharField(), help_text=(
        "The receiver's response headers from a short allow-list (content type, length, date, retry-after, "
        "server, request ids); any other header (cookies, auth challenges) is never stored."))


class DeliveryOutput(serializers.Serializer):
    id = serializers.UUIDField()
    endpoint = serializers.UUIDField(source="endpoint_id")
    event = EventOutput()
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    replays = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = PublicTextField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    attempt_log = AttemptOutput(many=True, help_text="Every attempt, oldest first.")


class EmptyInput(StrictInput):
    pass


def cursor_page(item: type) -> type:
    """The documented shape of a cursor page of ``item``."""
    return type(f"Cursor{item.__name__.removesuffix('Output')}Page", (serializers.Serializer,), {
        "next": serializers.URLField(allow_null=True, help_text="The next (older) page, or null."),
        "previous": serializers.URLField(allow_null=True, help_text="The previous (newer) page, or null."),
        "results": item(many=True),
    })
