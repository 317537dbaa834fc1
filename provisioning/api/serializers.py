"""Input and output serializers of provisioning's API: tenants (onboard, change, actions) and recovery events.

Validation of meaning lives in services (``tenants.services`` for a tenant's fields,
``provisioning.workflows.onboarding``).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.errors import ValidationFailed
from controlplane.hostpaths import PublicTextField, scrub_host_paths
from controlplane.strict import JSONBoolean, JSONString, StrictInput
from provisioning.models import AgentInstance, ProvisionedResource, RecoveryEvent
from tenants.choices import TenantStatus
from tenants.models import Plan, Tenant
from tenants.services import (
    METADATA_KEY_MAX,
    METADATA_MAX_KEYS,
    METADATA_VALUE_MAX,
    NAME_RE,
    RESERVED_SLUGS,
    SLUG_RE,
)

NAME_VALIDATOR = RegexValidator(NAME_RE, "must be 1-200 characters, not only spaces, no control characters")
_METADATA_HELP = (f"Your own string keys and values (at most {METADATA_MAX_KEYS} keys of up to {METADATA_KEY_MAX} "
                  f"characters, values up to {METADATA_VALUE_MAX}); on PATCH merged, a value \"\" removes its key.")


@extend_schema_field({"type": "object", "maxProperties": METADATA_MAX_KEYS,
                      "propertyNames": {"minLength": 1, "maxLength": METADATA_KEY_MAX, "pattern": "^[^\\[\\]\\x00]+$"},
                      "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_MAX}})
class _Metadata(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=JSONString(allow_blank=True, max_length=METADATA_VALUE_MAX,
                                                     trim_whitespace=False),
                         help_text=_METADATA_HELP, **kwargs)


class _OfferedPlan(serializers.ChoiceField):
    """The slug of an active plan. The choices are read when the serializer is made, so the OpenAPI schema's
    enum is the list of plans offered at that moment, and a plan nobody offers never reaches the service."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=[], **kwargs)

    def bind(self, field_name: str, parent: serializers.Serializer) -> None:
        super().bind(field_name, parent)
        self.choices = list(Plan.objects.filter(is_active=True).order_by("slug").values_list("slug", flat=True))

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        if data not in self.choices:
            raise ValidationFailed(f"plan {data!r} is not offered (available: {', '.join(self.choices) or 'none'})")
        return data


@extend_schema_field({"type": "string", "maxLength": 63, "pattern": SLUG_RE.pattern,
                      # What ``tenants.services.validate_slug`` also refuses, said where clients can read it.
                      "not": {"anyOf": [{"enum": sorted(RESERVED_SLUGS)}, {"pattern": "^pg-"}]}})
class _Slug(JSONString):
    pass


class TenantCreateInput(StrictInput):
    slug = _Slug(max_length=63, validators=[RegexValidator(SLUG_RE)],
                 help_text="Lowercase letters, digits and '-', starting and ending with a letter or digit; not a "
                           "reserved name (`admin`, `postgres`, `pg-...` and the others the schema lists).")
    name = JSONString(max_length=200, validators=[NAME_VALIDATOR])
    plan = _OfferedPlan(required=False, default="standard",
                        help_text="The slug of an offered plan (`GET /api/v1/plans`).")
    metadata = _Metadata(required=False)
    allow_no_release = JSONBoolean(
        required=False, default=False,
        help_text="Onboard even though you have no default release (the customer then runs no release of yours, "
                  "only what the runtime has installed). Without it, onboarding before a default release exists is "
                  "409 `no-default-release`.")


class TenantUpdateInput(StrictInput):
    name = JSONString(max_length=200, required=False, validators=[NAME_VALIDATOR])
    plan = _OfferedPlan(required=False, help_text="Move to another offered plan.")
    metadata = _Metadata(required=False)


class SuspendInput(StrictInput):
    reason = JSONString(max_length=500, required=False, allow_blank=True, default="",
                                   help_text="Shown to staff and in the audit log.")


class ResourceOutput(serializers.ModelSerializer):
    external_id = serializers.SerializerMethodField(
        help_text="The resource's name at its provider (schema, namespace, bucket prefix); a local directory is "
                  "named by its last component, never by its path on the control plane's host.")
    isolation = serializers.SerializerMethodField(
        help_text="Local profile: `sandboxed` (own OS user and bubblewrap sandbox) or `degraded` (shares the "
                  "control plane's user); null where it does not apply.")

    class Meta:
        model = ProvisionedResource
        fields = ["kind", "driver", "external_id", "status", "isolation", "updated_at"]

    def get_external_id(self, resource: ProvisionedResource) -> str:
        value = resource.external_id or ""
        if value.startswith("file://"):  # the local object store names its prefix by URL: a path all the same
            value = urllib.parse.unquote(value.removeprefix("file://"))
        elif "://" in value or "/" not in value:  # a provider's name or URL (s3://bucket/tenants/<id>/)
            return scrub_host_paths(value)
        # A local path (absolute, or relative to the control plane's directory): the object prefix from
        # ``tenants/`` on, otherwise the directory's own name.
        if "tenants/" in value:
            return value[value.index("tenants/"):]
        return value.rstrip("/").rsplit("/", 1)[-1]

    @extend_schema_field(serializers.ChoiceField(choices=["sandboxed", "degraded"], allow_null=True))
    def get_isolation(self, resource: ProvisionedResource) -> str | None:
        value = (resource.details or {}).get("isolation")
        return str(value) if value else None


class InstanceOutput(serializers.ModelSerializer):
    class Meta:
        model = AgentInstance
        # No `endpoint`: it is a loopback or in-cluster address, meaningless (and revealing) outside.
        fields = ["status", "last_heartbeat_at", "progress"]
        extra_kwargs = {"status": {"help_text": (
            "`running` once started and read back; `asleep` when stopped after `INSTANCE_IDLE_SUSPEND_S` without "
            "activity (a message or task wakes it: 202, answered after the boot); `stopped` when stopped on "
            "purpose (suspend, restart); `recovering`, `quarantined`, `failed` while or after a recovery.")}}


class TenantOutput(serializers.ModelSerializer):
    status = serializers.ChoiceField(choices=TenantStatus.choices)
    status_reason = PublicTextField(read_only=True)
    plan = serializers.CharField(source="plan_id", help_text="The plan's slug.")
    metadata = serializers.DictField(child=serializers.CharField())
    resources = ResourceOutput(many=True, read_only=True)
    instance = InstanceOutput(read_only=True, allow_null=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "plan", "metadata", "status", "status_reason", "created_at", "updated_at",
                  "resources", "instance", "url"]

    def get_url(self, tenant: Tenant) -> str:
        request = self.context.get("request")
        path = f"/api/v1/tenants/{tenant.id}"
        return request.build_absolute_uri(path) if request is not None else path


class RecoveryEventOutput(serializers.ModelSerializer):
    detail = PublicTextField(read_only=True)
    time_to_recover_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = RecoveryEvent
        fields = ["id", "reason", "detail", "outcome", "detected_at", "stopped_at", "resumed_at",
                  "from_checkpoint", "steps_lost", "repaired", "finished_at", "time_to_recover_s"]
