"""Renewal of a running instance's S3 session credentials: the service behind the internal endpoint.

An instance gets its first credentials in its Secret at boot. Before they expire, its S3 client
asks for fresh ones (``GET /internal/v1/s3-credentials/<tenant-id>``, ``agent_runtime.state.s3_credentials``)
and keeps running: no restart, no re-ensure. They are vended exactly as at boot, by
``vend_credentials`` (AssumeRole with the prefix-scoped session policy of the caller's own tenant),
so a renewal never reaches further than the first credentials did.

The caller names the tenant it expects (the one in its object-store URL); any other tenant is not
found, whether it exists or not, and the attempt is recorded as a security event. Each vend is
audited without its values; the values are never stored or logged here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction

from controlplane.errors import Conflict, NotFound
from provisioning.choices import ResourceKind
from provisioning.drivers.s3_objectstore import tenant_prefix, vend_credentials
from provisioning.resources.spec import tenant_spec
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Tenant

__all__ = ["VendedS3Credentials", "tenant_s3_credentials_renew"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VendedS3Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expiration: str
    bucket: str
    prefix: str


def tenant_s3_credentials_renew(*, tenant: Tenant, requested_tenant_id: str, actor: Actor) -> VendedS3Credentials:
    """Fresh STS credentials for ``tenant``'s own prefix, for the instance ``actor`` of that tenant.

    ``requested_tenant_id`` is what the instance asked for; the answer is only ever about ``tenant``
    (the token's), so naming another tenant is NotFound (the same answer as a tenant that does not
    exist: nothing is revealed about which ids are real).
    """
    if requested_tenant_id != str(tenant.pk):
        audit_record(actor=actor, action=AuditAction.SECURITY_CROSS_TENANT_ATTEMPT, tenant=tenant,
                     data={"resource": "s3-credentials", "requested_tenant_id": requested_tenant_id[:64]})
        log.warning("security event: instance of tenant %s asked for the S3 credentials of another tenant",
                    tenant.pk)
        raise NotFound("no S3 credentials for that tenant")
    spec = tenant_spec(tenant)
    store = spec.resources.get(ResourceKind.OBJECTSTORE)
    if store is None or store.details.get("credentials") != "sts":
        raise Conflict("this tenant's object store has no vended credentials (no STS role configured for it)")
    values = vend_credentials(spec)  # ProvisioningError (502) if STS refuses; its message carries no secret
    if not values:
        raise Conflict("S3 credentials are not vended by this control plane (S3_ROLE_ARN is not set)")
    vended = VendedS3Credentials(
        access_key_id=values["AWS_ACCESS_KEY_ID"], secret_access_key=values["AWS_SECRET_ACCESS_KEY"],
        session_token=values["AWS_SESSION_TOKEN"], expiration=values["AWS_CREDENTIAL_EXPIRATION"],
        bucket=str(store.details.get("bucket", "")), prefix=tenant_prefix(spec.tenant_id),
    )
    with transaction.atomic():
        audit_record(actor=actor, action=AuditAction.OBJECTSTORE_CREDENTIALS_RENEW, tenant=tenant,
                     data={"expires_at": vended.expiration, "prefix": vended.prefix})
    log.info("S3 credentials renewed for tenant %s until %s", tenant.pk, vended.expiration)
    return vended
