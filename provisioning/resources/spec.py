"""Build a ``TenantSpec`` from committed records: what drivers may know about one tenant."""

from __future__ import annotations

import base64

from provisioning.databases.servers import tenant_database_server
from provisioning.drivers.base import Ref, TenantId, TenantSpec
from provisioning.models import ProvisionedResource
from provisioning.resources import contributions
from tenants.actors import SYSTEM
from tenants.models import Tenant
from vault.choices import DB_PASSWORD_CREDENTIAL, INSTANCE_TOKEN_CREDENTIAL
from vault.services import credential_ensure_generated, tenant_object_keys

__all__ = ["tenant_spec", "resource_refs"]


def resource_refs(tenant: Tenant) -> dict[str, Ref]:
    return {
        r.kind: Ref(external_id=r.external_id, details=r.details)
        for r in ProvisionedResource.objects.filter(tenant=tenant)
    }


def tenant_spec(tenant: Tenant, *, with_secrets: tuple[str, ...] = (),
                resources: list[ProvisionedResource] | None = None) -> TenantSpec:
    """The spec for ``tenant``; secrets are fetched from the vault only when a step names them.

    ``resources`` (already loaded, e.g. prefetched for a batch) saves the per-tenant query.
    """
    secrets: dict[str, str] = {}
    if "db_password" in with_secrets:
        secrets["db_password"] = credential_ensure_generated(
            tenant=tenant, name=DB_PASSWORD_CREDENTIAL, actor=SYSTEM
        )
    if "object_key_b64" in with_secrets:
        current, *previous = tenant_object_keys(tenant=tenant)
        secrets["object_key_b64"] = base64.b64encode(current.key).decode()
        secrets["object_keys_previous_b64"] = ",".join(base64.b64encode(k.key).decode() for k in previous)
    if "instance_token" in with_secrets:
        secrets["instance_token"] = credential_ensure_generated(
            tenant=tenant, name=INSTANCE_TOKEN_CREDENTIAL, actor=SYSTEM, nbytes=32
        )
    return TenantSpec(
        tenant_id=TenantId(str(tenant.id)),
        resource_name=tenant.resource_name,
        operator_slug=tenant.operator.slug,
        plan=tenant.plan_id,
        resources=resource_refs(tenant) if resources is None else {
            r.kind: Ref(external_id=r.external_id, details=r.details) for r in resources},
        secrets=secrets,
        release=contributions.tenant_release(tenant.pk),
        database_server=tenant_database_server(tenant).name,
    )
