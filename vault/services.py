"""Vault writes and the few controlled reads of plaintext.

Plaintext leaves this module only to: the tenant's own instance (delivery endpoint),
and the provisioning drivers that hand a tenant its own database password and object
key. Nothing here logs a value, and errors never include one.
"""

from __future__ import annotations

import secrets
import threading
import time

from django.db import transaction
from django.utils import timezone

from controlplane.errors import NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.models import Tenant

from .choices import KeyPurpose, KeyStatus
from .envelope import credential_aad, new_key, open_sealed, seal
from .kek import WrappedKey, kek_provider
from .models import Credential, CredentialVersion, TenantDataKey

__all__ = [
    "tenant_data_key_ensure",
    "tenant_object_key",
    "credential_put",
    "credential_ensure_generated",
    "credential_reveal",
    "credential_revoke",
]

_CACHE_TTL_S = 300.0
_cache_lock = threading.Lock()
_key_cache: dict[tuple[str, str, int, str], tuple[float, bytes]] = {}


def tenant_data_key_ensure(*, tenant: Tenant, purpose: str = KeyPurpose.CREDENTIALS) -> TenantDataKey:
    """Return the tenant's active data key for ``purpose``, creating version 1 if there is none."""
    key = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose, status=KeyStatus.ACTIVE).first()
    if key is not None:
        return key
    with transaction.atomic():
        # Lock the tenant row so two workers cannot both create version 1.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        key = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose, status=KeyStatus.ACTIVE).first()
        if key is not None:
            return key
        wrapped = kek_provider().wrap(str(tenant.id), new_key())
        return TenantDataKey.objects.create(
            tenant=tenant, purpose=purpose, version=1, kek_id=wrapped.kek_id, wrapped_key=wrapped.blob
        )


def _unwrap(key: TenantDataKey) -> bytes:
    """Unwrap a data key, caching plaintext keys in memory for a few minutes (never on disk)."""
    cache_key = (str(key.tenant_id), key.purpose, key.version, key.kek_id)
    now = time.monotonic()
    with _cache_lock:
        hit = _key_cache.get(cache_key)
        if hit and hit[0] > now:
            return hit[1]
    plain = kek_provider().unwrap(str(key.tenant_id), WrappedKey(key.kek_id, bytes(key.wrapped_key)))
    with _cache_lock:
        _key_cache[cache_key] = (now + _CACHE_TTL_S, plain)
    return plain


def tenant_object_key(*, tenant: Tenant) -> bytes:
    """The tenant's object-store encryption key (its own wrapped data key, purpose ``objects``)."""
    return _unwrap(tenant_data_key_ensure(tenant=tenant, purpose=KeyPurpose.OBJECTS))


def _validate_name(name: str) -> None:
    if not name or len(name) > 100 or not all(c.isalnum() or c in "._-" for c in name):
        raise ValidationFailed("credential names use 1-100 letters, digits, '.', '_' or '-'")


def credential_put(*, tenant: Tenant, name: str, value: str, actor: Actor, one_time: bool = False) -> Credential:
    """Create a credential or add a new version; the new version becomes current."""
    _validate_name(name)
    if not isinstance(value, str) or not value:
        raise ValidationFailed("a credential value must be a non-empty string")
    data_key = tenant_data_key_ensure(tenant=tenant)
    plain_key = _unwrap(data_key)
    with transaction.atomic():
        credential, _ = Credential.objects.select_for_update().get_or_create(tenant=tenant, name=name)
        version = credential.current_version + 1
        CredentialVersion.objects.create(
            credential=credential,
            version=version,
            data_key_version=data_key.version,
            ciphertext=seal(plain_key, value.encode(), credential_aad(str(tenant.id), name, version)),
        )
        credential.current_version = version
        credential.one_time = one_time
        credential.revoked_at = None
        credential.consumed_at = None
        credential.save()
        audit_record(
            actor=actor, action="credential.put", target=credential, tenant=tenant,
            data={"name": name, "version": version},
        )
    return credential


def credential_ensure_generated(*, tenant: Tenant, name: str, actor: Actor, nbytes: int = 24) -> str:
    """Return the value of a control-plane-generated credential, generating it once (idempotent)."""
    credential = Credential.objects.filter(tenant=tenant, name=name, revoked_at__isnull=True).first()
    if credential is None or credential.current_version == 0:
        credential_put(tenant=tenant, name=name, value=secrets.token_urlsafe(nbytes), actor=actor)
    return credential_reveal(tenant=tenant, name=name, actor=actor, audit=False)


def credential_reveal(*, tenant: Tenant, name: str, actor: Actor, audit: bool = True) -> str:
    """Decrypt the current version. Fails loudly (DecryptionFailed) on any tampering or misplacement."""
    credential = Credential.objects.filter(tenant=tenant, name=name).first()
    if credential is None or credential.revoked_at is not None or credential.consumed_at is not None:
        raise NotFound(f"credential {name!r} not found")
    row = CredentialVersion.objects.get(credential=credential, version=credential.current_version)
    data_key = TenantDataKey.objects.get(
        tenant=tenant, purpose=KeyPurpose.CREDENTIALS, version=row.data_key_version
    )
    value = open_sealed(
        _unwrap(data_key), bytes(row.ciphertext), credential_aad(str(tenant.id), name, row.version)
    ).decode()
    if audit:
        with transaction.atomic():
            Credential.objects.filter(pk=credential.pk).update(last_used_at=timezone.now())
            audit_record(
                actor=actor, action="credential.read", target=credential, tenant=tenant,
                data={"name": name, "version": row.version},
            )
    return value


def credential_revoke(*, tenant: Tenant, name: str, actor: Actor) -> Credential:
    with transaction.atomic():
        credential = Credential.objects.select_for_update().filter(tenant=tenant, name=name).first()
        if credential is None or credential.revoked_at is not None:
            raise NotFound(f"credential {name!r} not found")
        credential.revoked_at = timezone.now()
        credential.save(update_fields=["revoked_at", "updated_at"])
        audit_record(actor=actor, action="credential.revoke", target=credential, tenant=tenant, data={"name": name})
    return credential
