"""Vault reads that never touch plaintext: credential metadata, key versions, rotation progress."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from controlplane.errors import NotFound
from tenants.choices import TENANT_GONE
from tenants.models import Tenant

from .choices import SYSTEM_CREDENTIAL_PREFIX, CredentialState, KeyStatus
from .models import Credential, RotationJob, TenantDataKey

__all__ = ["credential_list", "credential_get", "credential_deliverable", "credential_state", "kek_ids_in_use",
           "rotation_job_get"]


def credential_list(*, tenant: Tenant, include_system: bool = False) -> QuerySet[Credential]:
    """The tenant's credentials (metadata only). ``system.`` names are hidden from operators."""
    qs = Credential.objects.filter(tenant=tenant, current_version__gt=0)
    if not include_system:
        qs = qs.exclude(name__startswith=SYSTEM_CREDENTIAL_PREFIX)
    return qs.order_by("name", "id")


def credential_get(*, tenant: Tenant, name: str) -> Credential:
    credential = credential_list(tenant=tenant).filter(name=name).first()
    if credential is None:
        raise NotFound("credential not found")
    return credential


def credential_deliverable(*, tenant: Tenant, name: object) -> bool:
    """Whether ``credential_deliver`` would hand ``name`` to the tenant's instance now, without delivering it: no
    value is opened, a one-time credential is not consumed and nothing is audited. The instance asks this, once a
    heartbeat, for the credentials its blocked tasks wait for; a "not yet" is a poll, not a refused read (a
    delivery miss is audited, and would be every two seconds for as long as the task waits)."""
    if not isinstance(name, str) or name.startswith(SYSTEM_CREDENTIAL_PREFIX) or tenant.status in TENANT_GONE:
        return False
    return Credential.objects.filter(tenant=tenant, name=name, current_version__gt=0, revoked_at__isnull=True,
                                     consumed_at__isnull=True).exists()


def credential_state(credential: Credential) -> str:
    if credential.revoked_at is not None:
        return CredentialState.REVOKED
    if credential.consumed_at is not None:
        return CredentialState.CONSUMED
    return CredentialState.ACTIVE


def kek_ids_in_use() -> list[str]:
    """Key-encryption keys still wrapping some data key or a feature's wrapped secret (``vault.wrapped_secrets``);
    any other ring version may be removed."""
    from .wrapped_secrets import wrapped_secrets_sources

    keys = TenantDataKey.objects.exclude(status=KeyStatus.DESTROYED)  # a destroyed key has nothing left to unwrap
    in_use = set(keys.values_list("kek_id", flat=True))
    for source in wrapped_secrets_sources():
        in_use |= source.kek_ids()
    return sorted(in_use)


def rotation_job_get(*, job_id: object) -> RotationJob:
    try:
        pk = uuid.UUID(str(job_id))
    except ValueError:
        raise NotFound("rotation job not found") from None
    job = RotationJob.objects.filter(pk=pk).first()
    if job is None:
        raise NotFound("rotation job not found")
    return job
