"""Input and output shapes of the MCP server registry API. Inputs are strict (unknown fields are a 400); outputs
carry names and URLs only: a server's token is never stored here, let alone shown."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.strict import JSONString, StrictInput

from ..choices import NAME_RE, ServerScope


class McpServerCreateInput(StrictInput):
    name = serializers.RegexField(NAME_RE.pattern, max_length=60,
                                  help_text="What the agent calls it: `ctx.mcp(\"<name>\")`.")
    url = JSONString(max_length=2000, help_text="The server's streamable HTTP endpoint (https).")
    credential = JSONString(required=False, allow_blank=True, max_length=200, default="",
                            help_text="The NAME of a credential in the customer's vault, sent as the bearer token. "
                                      "For an operator-wide server, each customer's vault is expected to hold it.")
    connection = serializers.RegexField(r"^[-a-zA-Z0-9_]*$", required=False, allow_blank=True, max_length=60,
                                        default="",
                                        help_text="Or: a connected account's provider; its current access token is "
                                                  "the bearer token (refreshed by the control plane).")
    trust_annotations = serializers.BooleanField(required=False, default=True,
                                                 help_text="false: the tools' hints are ignored, and a tool without "
                                                           "an override is an effect (through the effect ledger).")
    timeout_s = serializers.FloatField(required=False, default=30.0, min_value=0.1, max_value=600.0)
    tools = serializers.DictField(required=False, default=dict, child=serializers.JSONField(),
                                  help_text="Per-tool override of the annotations: tool name -> `read_only`, "
                                            "`idempotent` or `effect`, or {\"kind\": \"read_only\", \"ttl_s\": 300}.")
    allowed_tools = serializers.ListField(child=JSONString(max_length=200), required=False, allow_null=True,
                                          default=None, max_length=500,
                                          help_text="Only these tools are listed to the agent and callable; "
                                                    "null or absent: every tool the server lists.")


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


class McpServerDeletedOutput(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    deleted = serializers.BooleanField()
