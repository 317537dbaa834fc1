"""Input and output shapes of the MCP server registry API. Inputs are strict (unknown fields are a 400); outputs
carry names and URLs only: a server's token is never stored here, let alone shown."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.strict import JSONBoolean, JSONNumber, JSONString, StrictInput, free_json_validate
from controlplane.urlform import URLFormValidator

from ..choices import NAME_RE, ServerScope

# The runtime's tool override (``agent_runtime.mcp.config._override``; the control plane runs those rules in a
# subprocess and never imports them): a kind, or ``{"kind", "ttl_s"}`` where only a read_only tool's output is
# cached for a positive number of seconds. tests/test_api_strict_types.py holds the kinds to the runtime's.
TOOL_KINDS = ("read_only", "idempotent", "effect")
TOOL_OVERRIDES_SCHEMA: dict[str, Any] = {"type": "object", "propertyNames": {"pattern": "^[^\\x00]*$"},
                                         "additionalProperties": {"anyOf": [
    {"type": "string", "enum": list(TOOL_KINDS)},
    {"type": "object", "required": ["kind"], "additionalProperties": False,
     "properties": {"kind": {"type": "string", "enum": list(TOOL_KINDS)},
                    "ttl_s": {"type": ["number", "null"], "exclusiveMinimum": 0}},
     "if": {"properties": {"ttl_s": {"type": "number"}}, "required": ["ttl_s"]},
     "then": {"properties": {"kind": {"const": "read_only"}}}},
]}}


@extend_schema_field(TOOL_OVERRIDES_SCHEMA)
class _ToolOverrides(serializers.DictField):
    """Checked by the runtime's rules in the service (400 naming ``mcp.<server>.tools.<tool>``); typed here. A NUL
    in a tool's name is refused here: PostgreSQL's jsonb cannot hold one (it was a 500 at the insert)."""

    def to_internal_value(self, data: Any) -> Any:
        free_json_validate(data, "tools")
        return super().to_internal_value(data)


class McpServerCreateInput(StrictInput):
    name = serializers.RegexField(NAME_RE.pattern, max_length=60,
                                  help_text="What the agent calls it: `ctx.mcp(\"<name>\")`.")
    url = JSONString(max_length=2000, validators=[URLFormValidator(
        allow_http_setting="MCP_SERVERS_ALLOW_HTTP",
        message="url must be an https:// URL (the server's streamable HTTP endpoint) without credentials")],
        help_text="The server's streamable HTTP endpoint (https).")
    credential = JSONString(required=False, allow_blank=True, max_length=200, default="",
                            help_text="The NAME of a credential in the customer's vault, sent as the bearer token. "
                                      "For an operator-wide server, each customer's vault is expected to hold it.")
    connection = serializers.RegexField(r"^[-a-zA-Z0-9_]*$", required=False, allow_blank=True, max_length=60,
                                        default="",
                                        help_text="Or: a connected account's provider; its current access token is "
                                                  "the bearer token (refreshed by the control plane).")
    trust_annotations = JSONBoolean(required=False, default=True,
                                                 help_text="false: the tools' hints are ignored, and a tool without "
                                                           "an override is an effect (through the effect ledger).")
    timeout_s = JSONNumber(required=False, default=30.0, min_value=0.1, max_value=600.0)
    tools = _ToolOverrides(required=False, default=dict, child=serializers.JSONField(),
                                  help_text="Per-tool override of the annotations: tool name -> `read_only`, "
                                            "`idempotent` or `effect`, or {\"kind\": \"read_only\", \"ttl_s\": 300}.")
    allowed_tools = serializers.ListField(child=JSONString(max_length=200), required=False, allow_null=True,
                                          default=None, max_length=500,
                                          help_text="Only these tools are listed to the agent and callable; "
                                                    "null or absent: every tool the server lists.")

    # ``mcp_server_create``: the token comes from a credential or a connection, not both (400).
    schema_rules: ClassVar[dict[str, Any]] = {"not": {
        "properties": {"credential": {"minLength": 1}, "connection": {"minLength": 1}},
        "required": ["credential", "connection"]}}


class McpServerOutput(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    scope = serializers.SerializerMethodField(help_text="`operator`: every customer of yours; `tenant`: one.")
    tenant = serializers.UUIDField(source="tenant_id", allow_null=True)
    url = serializers.CharField()
    credential = serializers.CharField(help_text="A credential name (never its value), or empty.")
    connection = serializers.CharField(help_text="A connected account's provider, or empty.")
    trust_annotations = serializers.BooleanField()
    timeout_s = serializers.FloatField()
    tools = serializers.DictField(child=serializers.JSONField())
    allowed_tools = serializers.ListField(child=serializers.CharField(), allow_null=True)
    created_at = serializers.DateTimeField()

    def get_scope(self, obj: Any) -> str:
        return ServerScope.OPERATOR if obj.tenant_id is None else ServerScope.TENANT
