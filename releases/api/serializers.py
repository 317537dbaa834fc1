"""Shapes of the releases API. A wheel upload is multipart (the wheel as ``file``); the rest is strict JSON,
an image release included."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.validators import RegexValidator
from django.db.models import Count
from rest_framework import serializers

from controlplane.hostpaths import PublicTextField
from controlplane.strict import JSONBoolean, JSONInteger, JSONNumber, JSONString, StrictInput

from ..choices import ItemStatus
from ..models import AgentRelease, Rollout, RolloutItem
from ..rollouts import MAX_SOAK_S, MAX_WAVE_SIZE
from ..services import (
    EGRESS_HOST_PATTERN,
    MAX_CONFIG_BYTES,
    MAX_EGRESS_HOST_CHARS,
    MAX_EGRESS_HOSTS,
    MAX_KIND_DESCRIPTION_CHARS,
    MAX_NOTES_CHARS,
    VERSION_PATTERN,
)


class ReleaseUploadInput(StrictInput):
    """A release as a wheel, uploaded as multipart (the local profile's kind of release)."""

    file = serializers.FileField(help_text="The agent package as a wheel (.whl).")
    sha256 = JSONString(required=False, max_length=71,
                        help_text="The wheel's sha256 (hex, optionally `sha256:`): checked before anything else.")
    notes = JSONString(required=False, allow_blank=True, default="", max_length=MAX_NOTES_CHARS)
    default_config = JSONString(required=False, default="{}", validators=[RegexValidator(
        r"^[ \t\n\r]*\{[^\x00]*\}[ \t\n\r]*$", "default_config must be a JSON object")],
        help_text="A JSON object as text: the configuration tenants get unless they override it. The pattern says "
                  "it is an object (`0` or `[]` is refused); whether the text parses is checked, not patterned.")


class ReleaseImageInput(StrictInput):
    """A release as a container image pinned by digest (the Kubernetes profile's kind of release)."""

    image = JSONString(max_length=500, help_text="The image, its registry named and pinned by digest: "
                                                 "`registry.example.com/acme/agent@sha256:<64 hex>` (a tag beside "
                                                 "the digest is allowed and dropped; a tag alone is refused).")
    version = JSONString(max_length=100, validators=[RegexValidator(
        VERSION_PATTERN, "version must be 1 to 100 letters, digits, '.', '_', '+' or '-', starting with a letter "
                         "or digit (e.g. 1.4.0)")], help_text="The release's version, new among yours (e.g. `1.4.0`).")
    kinds = serializers.DictField(
        child=JSONString(allow_blank=True, max_length=MAX_KIND_DESCRIPTION_CHARS),
        help_text="The agent kinds the image provides -> their descriptions (at least one). Not verified here: "
                  "the image is never pulled by the control plane; its instances' boot says what loads.")
    notes = JSONString(required=False, allow_blank=True, default="", max_length=MAX_NOTES_CHARS)
    default_config = serializers.DictField(required=False, default=dict,
                                           help_text="The configuration tenants get unless they override it "
                                                     f"(at most {MAX_CONFIG_BYTES} bytes of JSON).")
    config_schema = serializers.DictField(required=False, allow_null=True, default=None,
                                          help_text="The image's configuration schema: one JSON Schema object "
                                                    "(`type: object`); `default_config` and every customer's "
                                                    "overrides are validated against it. Null: any JSON object.")
    connections = serializers.ListField(child=JSONString(max_length=60), required=False, default=list,
                                        help_text="The providers whose connected accounts the image's agents use "
                                                  "(their `Agent(connections=...)`): its instances get only these.")
    egress = serializers.ListField(
        child=JSONString(max_length=MAX_EGRESS_HOST_CHARS, validators=[RegexValidator(
            EGRESS_HOST_PATTERN, "an egress host is a host name (api.openai.com) or *.suffix (*.example.com)")]),
        required=False, default=list, max_length=MAX_EGRESS_HOSTS,
        help_text="The internet hosts the image's agents call (their `Agent(egress=...)`): the egress proxy lets the "
                  "tenants running this release reach them on 443 and 80.")


class ReleaseOutput(serializers.ModelSerializer):
    kinds = serializers.DictField(child=serializers.CharField(), help_text="Agent kind -> description.")
    default_config = serializers.DictField()
    config_schema = serializers.DictField(allow_null=True, help_text="The agents' configuration schemas merged "
                                                                     "(null: the release accepts any JSON object).")
    connections = serializers.ListField(child=serializers.CharField(),
                                        help_text="The providers whose connected accounts the agents declare "
                                                  "(`Agent(connections=...)`): the only ones its instances get.")
    egress = serializers.ListField(child=serializers.CharField(),
                                   help_text="The internet hosts the agents declare (`Agent(egress=...)`): the egress "
                                             "proxy lets the tenants running this release reach them (443, 80).")

    class Meta:
        model = AgentRelease
        fields = ["id", "version", "distribution", "digest", "image", "filename", "size_bytes", "kinds",
                  "default_config", "config_schema", "connections", "egress", "notes", "created_by", "created_at"]


class ReleaseBrief(serializers.ModelSerializer):
    class Meta:
        model = AgentRelease
        fields = ["id", "version", "digest"]


class DefaultReleaseInput(StrictInput):
    release = serializers.UUIDField(help_text="One of your releases: what new customers start on.")


class DefaultReleaseOutput(serializers.Serializer):
    release = ReleaseBrief(allow_null=True, help_text="Null: new customers run the runtime's installed agents.")


class TenantReleaseInput(StrictInput):
    release = serializers.UUIDField(required=False, allow_null=True,
                                    help_text="The release to pin the tenant to (required when pinning).")
    pinned = JSONBoolean(help_text="True: stay on `release` whatever rollouts do. False: follow "
                                                "your default release (and future rollouts).")

    # ``tenant_release_pin`` refuses ``pinned: true`` without a release (400): the schema says so too.
    schema_rules: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"pinned": {"const": True}}, "required": ["pinned"]},
        "then": {"properties": {"release": {"type": "string", "format": "uuid"}}, "required": ["release"]},
    }


class TenantReleaseOutput(serializers.Serializer):
    tenant = serializers.UUIDField(source="tenant_id")
    release = ReleaseBrief(allow_null=True, help_text="What its instance loads; null: the runtime's agents.")
    pinned = serializers.BooleanField()
    running = serializers.DictField(allow_null=True, help_text="The release its instance last booted with, as "
                                    "the instance recorded it (`version`, `digest`); null: the runtime's agents "
                                    "or not booted yet.")
    updated_at = serializers.DateTimeField()


class RolloutCreateInput(StrictInput):
    release = serializers.UUIDField()
    canary = JSONInteger(required=False, min_value=1, max_value=MAX_WAVE_SIZE,
                                      help_text="Tenants in the canary wave (default RELEASE_ROLLOUT_CANARY).")
    canary_percent = JSONNumber(required=False, min_value=0.01, max_value=100,
                                            help_text="Or the canary as a percentage of the tenants (at least one).")
    wave_size = JSONInteger(required=False, min_value=1, max_value=MAX_WAVE_SIZE,
                                         help_text="Tenants per wave after the canary (default 10).")
    soak_s = JSONInteger(required=False, min_value=0, max_value=MAX_SOAK_S,
                                      help_text="Seconds each wave must stay healthy before the next starts.")


class RolloutItemOutput(serializers.ModelSerializer):
    tenant = serializers.UUIDField(source="tenant_id")
    tenant_slug = serializers.CharField(source="tenant.slug")
    from_release = ReleaseBrief(allow_null=True)
    error = PublicTextField(read_only=True)

    class Meta:
        model = RolloutItem
        fields = ["tenant", "tenant_slug", "wave", "status", "from_release", "upgrades", "error", "started_at",
                  "upgraded_at", "rolled_back_at", "downtime_ms", "tasks_crossed"]


class RolloutOutput(serializers.ModelSerializer):
    release = ReleaseBrief()
    counts = serializers.SerializerMethodField(help_text="Tenants by item status.")
    reason = PublicTextField(read_only=True)

    class Meta:
        model = Rollout
        fields = ["id", "release", "status", "canary", "wave_size", "soak_s", "reason", "counts", "created_by",
                  "created_at", "updated_at", "finished_at"]

    def get_counts(self, rollout: Rollout) -> dict[str, int]:
        counts = {status: 0 for status in ItemStatus.values}
        for row in rollout.items.values("status").annotate(n=Count("id")):
            counts[row["status"]] = row["n"]
        return counts


class RolloutDetailOutput(RolloutOutput):
    items = RolloutItemOutput(many=True, read_only=True)

    class Meta(RolloutOutput.Meta):
        fields = [*RolloutOutput.Meta.fields, "items"]


class AgentConfigInput(StrictInput):
    overrides = serializers.DictField(help_text="This customer's values, replacing the release's default of each "
                                                "top-level key they hold (the whole set: a key left out goes back "
                                                "to the default). A credential property holds the NAME of a "
                                                "credential in the customer's vault, never its value.")


class AgentConfigOutput(serializers.Serializer):
    tenant = serializers.UUIDField(source="tenant_id")
    release = ReleaseBrief(allow_null=True, help_text="The release whose schema and defaults apply.")
    config_schema = serializers.DictField(source="schema", allow_null=True,
                                          help_text="The release's schema (null: any JSON object).")
    defaults = serializers.DictField(help_text="The release's default_config.")
    overrides = serializers.DictField(help_text="This customer's overrides.")
    effective = serializers.DictField(help_text="What the agent's next task gets as ctx.config: the defaults, "
                                                "each top-level key the overrides hold replaced.")
    credential_fields = serializers.ListField(child=serializers.CharField(),
                                              help_text="Properties holding credential names (`\"format\": "
                                                        "\"credential\"`); values are never shown anywhere.")
    updated_at = serializers.DateTimeField(allow_null=True)
