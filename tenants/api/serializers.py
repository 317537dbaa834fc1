"""Small input and output serializers for the tenant API. Validation of meaning lives in services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from provisioning.models import AgentInstance, ProvisionedResource
from tenants.choices import TenantStatus
from tenants.models import Tenant


class TenantCreateInput(serializers.Serializer):
    slug = serializers.CharField(max_length=63, help_text="Lowercase letters, digits and '-'.")
    name = serializers.CharField(max_length=200)
    plan = serializers.CharField(max_length=40, required=False, default="standard")


class ResourceOutput(serializers.ModelSerializer):
    isolation = serializers.SerializerMethodField(
        help_text="Local profile: `sandboxed` (own OS user and bubblewrap sandbox) or `degraded` (shares the "
                  "control plane's user); null where it does not apply.")

    class Meta:
        model = ProvisionedResource
        fields = ["kind", "driver", "external_id", "status", "isolation", "updated_at"]

    @extend_schema_field(serializers.ChoiceField(choices=["sandboxed", "degraded"], allow_null=True))
    def get_isolation(self, resource: ProvisionedResource) -> str | None:
        value = (resource.details or {}).get("isolation")
        return str(value) if value else None


class InstanceOutput(serializers.ModelSerializer):
    class Meta:
        model = AgentInstance
        fields = ["status", "endpoint", "last_heartbeat_at", "progress"]


class TenantOutput(serializers.ModelSerializer):
    status = serializers.ChoiceField(choices=TenantStatus.choices)
    resources = ResourceOutput(many=True, read_only=True)
    instance = InstanceOutput(read_only=True, allow_null=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "plan", "status", "status_reason", "created_at", "updated_at",
                  "resources", "instance", "url"]

    def get_url(self, tenant: Tenant) -> str:
        request = self.context.get("request")
        path = f"/api/v1/tenants/{tenant.id}"
        return request.build_absolute_uri(path) if request is not None else path
