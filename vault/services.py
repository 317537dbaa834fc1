"""Vault writes and the few controlled reads of plaintext.

Plaintext leaves this module only to: the tenant's own instance (delivery endpoint),
and the provisioning drivers that hand a tenant its own database password and object
key. Nothing here logs a value, and errors never include one. Rotation lives in
``rotation.py``; reads of metadata in ``selectors.py``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from controlplane.errors import Conflict, DecryptionFailed, NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TENANT_GONE, ActorKind
from tenants.models import Tenant

from .choices import SYSTEM_CREDENTIAL_PREFIX, KeyPurpose, KeyStatus
from .envelope import cipher_cache_clear, credential_aad, new_key, open_sealed, seal
from .kek import kek_assert_persisted, kek_provider, kek_unwrap
from .models import Credential, CredentialVersion, TenantDataKey

__all__ = [
    "DeliveredCredential",
    "ObjectKey",
    "MAX_VALUE_CHARS",
    "credential_destroy",
    "data_key_cache_clear",
    "data_key_cache_forget",
    "tenant_data_key_ensure",
    "tenant_data_key_unwrap_verified",
    "tenant_object_key",
    "tenant_object_keys",
    "tenant_object_keys_deliver",
    "credential_put",
    "credential_ensure_generated",
    "credential_reveal",
    "credential_deliver",
    "credential_revoke",
]

log = logging.getLogger(__name__)

MAX_VALUE_CHARS = 65536


@dataclass(frozen=True)
class DeliveredCredential:
    name: str
    version: int
    value: str = field(repr=False)


@dataclass(frozen=True)
class ObjectKey:
    version: int
    status: str
    key: bytes = field(repr=False)

_CACHE_TTL_S = 300.0
_cache_lock = threading.Lock()
_CACHE_MAX_ENTRIES = 10_000
_key_cache: dict[tuple[object, str, int, str, str | None, bytes], tuple[float, bytes]] = {}


def tenant_data_key_ensure(*, tenant: Tenant, purpose: str = KeyPurpose.CREDENTIALS) -> TenantDataKey:
    """Return the tenant's active data key for ``purpose``, creating the next version if there is none."""
    key = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose, status=KeyStatus.ACTIVE).first()
    if key is not None:
        return key
    with transaction.atomic():
        # Lock the tenant row so two workers cannot both create version 1.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        key = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose, status=KeyStatus.ACTIVE).first()
        if key is not None:
            return key
        latest = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose).order_by("-version").first()
        wrapped = kek_provider().wrap(str(tenant.id), new_key())
        return TenantDataKey.objects.create(
            tenant=tenant, purpose=purpose, version=(latest.version + 1) if latest else 1,
            kek_id=wrapped.kek_id, kek_fingerprint=wrapped.fingerprint, wrapped_key=wrapped.blob,
        )


def _unwrap(key: TenantDataKey) -> bytes:
    """Unwrap a data key, caching plaintext keys in memory for a few minutes (never on disk).

    The wrapped bytes are part of the cache key, so a re-wrapped or tampered row is never
    answered from the cache with what an earlier row held.
    """
    _refuse_destroyed(key)
    wrapped = key.wrapped
    cache_key = (key.tenant_id, key.purpose, key.version, key.kek_id, wrapped.fingerprint, wrapped.blob)
    now = time.monotonic()
    hit = _key_cache.get(cache_key)  # a dict read is atomic; the lock guards writes
    if hit is not None and hit[0] > now:
        return hit[1]
    plain = kek_unwrap(str(key.tenant_id), wrapped)
    with _cache_lock:
        if len(_key_cache) > _CACHE_MAX_ENTRIES:
            _key_cache.clear()
        _key_cache[cache_key] = (now + _CACHE_TTL_S, plain)
    return plain


def _refuse_destroyed(key: TenantDataKey) -> None:
    if key.status == KeyStatus.DESTROYED:
        raise DecryptionFailed(
            f"{key.purpose} data key version {key.version} of this tenant was destroyed (crypto-shredded): "
            "nothing sealed under it can be opened any more"
        )


def data_key_cache_forget(*, tenant_id: object, purpose: str, version: int) -> None:
    """Drop this process's cached plaintext of one data-key version (it was just destroyed)."""
    with _cache_lock:
        for cache_key in [k for k in _key_cache if k[:3] == (tenant_id, purpose, version)]:
            del _key_cache[cache_key]
    cipher_cache_clear()  # the cipher contexts hold key bytes too


def tenant_data_key_unwrap_verified(*, key: TenantDataKey) -> bytes:
    """Unwrap ``key`` afresh (never from this process's cache) and check that the key-encryption key
    that wrapped it is one every process has: on disk for the development key ring, in KMS for KMS.

    For steps about to delete the last other copy of something this key encrypts (deprovisioning
    archives a schema with it, then drops the schema). Raises a VaultError subclass otherwise.
    """
    _refuse_destroyed(key)
    wrapped = key.wrapped
    plain = kek_unwrap(str(key.tenant_id), wrapped)
    kek_assert_persisted(wrapped)
    return plain


def data_key_cache_clear() -> None:
    """Forget every unwrapped data key held by this process (e.g. after revoking KEK access)."""
    with _cache_lock:
        _key_cache.clear()
    cipher_cache_clear()


def tenant_object_key(*, tenant: Tenant, version: int | None = None) -> bytes:
    """The tenant's object-store encryption key (its own wrapped data key, purpose ``objects``).

    ``version`` reads an older (possibly retired) version, e.g. to open a deprovisioned tenant's archive.
    """
    if version is None:
        return _unwrap(tenant_data_key_ensure(tenant=tenant, purpose=KeyPurpose.OBJECTS))
    return _unwrap(TenantDataKey.objects.get(tenant=tenant, purpose=KeyPurpose.OBJECTS, version=version))


def tenant_object_keys(*, tenant: Tenant) -> list[ObjectKey]:
    """Every object-key version of the tenant, newest (the one that encrypts) first.

    Retired versions stay here so objects written before a rotation remain readable; destroyed ones open nothing.
    """
    tenant_data_key_ensure(tenant=tenant, purpose=KeyPurpose.OBJECTS)
    rows = (TenantDataKey.objects.filter(tenant=tenant, purpose=KeyPurpose.OBJECTS)
            .exclude(status=KeyStatus.DESTROYED).order_by("-version"))
    return [ObjectKey(version=row.version, status=row.status, key=_unwrap(row)) for row in rows]


def tenant_object_keys_deliver(*, tenant: Tenant, actor: Actor) -> list[ObjectKey]:
    """``tenant_object_keys`` for the tenant's own instance, audited (key bytes never in the row)."""
    keys = tenant_object_keys(tenant=tenant)
    audit_record(actor=actor, action=AuditAction.VAULT_OBJECT_KEYS_DELIVER, tenant=tenant,
                 data={"versions": [k.version for k in keys]})
    return keys


def _validate_name(name: str) -> None:
    if (not isinstance(name, str) or not name or len(name) > 100
            or not all(c.isascii() and (c.isalnum() or c in "._-") for c in name)):
        raise ValidationFailed("credential names use 1-100 ASCII letters, digits, '.', '_' or '-'")


def _is_reserved(name: str) -> bool:
    return name.startswith(SYSTEM_CREDENTIAL_PREFIX)


def _check_tenant_open(tenant: Tenant) -> None:
    if tenant.status in TENANT_GONE:
        raise Conflict(f"tenant is {tenant.status}: its credentials can no longer change")


def _active_key_for_write(tenant: Tenant) -> TenantDataKey:
    """The newest active credentials key, share-locked so a rotation cannot retire it under us.

    Rotation retires an old version only while holding it FOR UPDATE and after checking that no
    credential version still uses it; a writer holding FOR SHARE makes that check wait for it.
    """
    rows = list(TenantDataKey.objects.raw(
        "SELECT * FROM vault_tenantdatakey WHERE tenant_id = %s AND purpose = %s AND status = %s "
        "ORDER BY version DESC LIMIT 1 FOR SHARE",
        [tenant.pk, KeyPurpose.CREDENTIALS, KeyStatus.ACTIVE],
    ))
    if not rows:
        raise Conflict("the tenant has no active credentials key (retired by deprovisioning?)")
    return rows[0]


def credential_put(*, tenant: Tenant, name: str, value: str, actor: Actor, one_time: bool = False) -> Credential:
    """Create a credential or add a new version; the new version becomes current.

    Names under ``system.`` are written by the control plane only (the system actor).
    """
    _validate_name(name)
    if _is_reserved(name) and actor.kind != ActorKind.SYSTEM:
        raise ValidationFailed(f"credential names starting with {SYSTEM_CREDENTIAL_PREFIX!r} are reserved")
    if not isinstance(value, str) or not value:
        raise ValidationFailed("a credential value must be a non-empty string")
    if len(value) > MAX_VALUE_CHARS:
        raise ValidationFailed(f"a credential value is at most {MAX_VALUE_CHARS} characters")
    _check_tenant_open(tenant)
    tenant_data_key_ensure(tenant=tenant)
    with transaction.atomic():
        data_key = _active_key_for_write(tenant)
        credential, _ = Credential.objects.select_for_update().get_or_create(tenant=tenant, name=name)
        version = credential.current_version + 1
        CredentialVersion.objects.create(
            credential=credential,
            version=version,
            data_key_version=data_key.version,
            ciphertext=seal(_unwrap(data_key), value.encode(), credential_aad(str(tenant.id), name, version)),
        )
        credential.current_version = version
        credential.one_time = one_time
        credential.revoked_at = None
        credential.consumed_at = None
        credential.save()
        audit_record(
            actor=actor, action=AuditAction.CREDENTIAL_PUT, target=credential, tenant=tenant,
            data={"name": name, "version": version, "one_time": one_time},
        )
    return credential


def credential_ensure_generated(*, tenant: Tenant, name: str, actor: Actor, nbytes: int = 24) -> str:
    """Return the value of a control-plane-generated credential, generating it once (idempotent)."""
    credential = Credential.objects.filter(tenant=tenant, name=name, revoked_at__isnull=True).first()
    if credential is None or credential.current_version == 0:
        value = secrets.token_urlsafe(nbytes)
        credential_put(tenant=tenant, name=name, value=value, actor=actor)
        return value
    return credential_reveal(tenant=tenant, name=name, actor=actor, audit=False)


def _open_current(tenant: Tenant, credential: Credential) -> tuple[int, str]:
    row = CredentialVersion.objects.get(credential=credential, version=credential.current_version)
    data_key = TenantDataKey.objects.get(
        tenant=tenant, purpose=KeyPurpose.CREDENTIALS, version=row.data_key_version
    )
    aad = credential_aad(str(tenant.id), credential.name, row.version)
    return row.version, open_sealed(_unwrap(data_key), bytes(row.ciphertext), aad).decode()


def credential_reveal(*, tenant: Tenant, name: str, actor: Actor, audit: bool = True) -> str:
    """Decrypt the current version. Fails loudly (DecryptionFailed) on any tampering or misplacement."""
    credential = Credential.objects.filter(tenant=tenant, name=name).first()
    if credential is None or credential.revoked_at is not None or credential.consumed_at is not None:
        raise NotFound(f"credential {name!r} not found")
    version, value = _open_current(tenant, credential)
    if audit:
        with transaction.atomic():
            Credential.objects.filter(pk=credential.pk).update(last_used_at=timezone.now())
            audit_record(
                actor=actor, action=AuditAction.CREDENTIAL_READ, target=credential, tenant=tenant,
                data={"name": name, "version": version},
            )
    return value


def credential_deliver(*, tenant: Tenant, name: str, actor: Actor) -> DeliveredCredential:
    """Hand the current value to the tenant's own instance; every attempt is audited.

    The lookup is confined to ``tenant``: another tenant's names are not addressable. A miss
    on a name that exists in another tenant is recorded as a security event. A one-time
    credential is consumed in the same transaction that delivers it, so it is delivered once.
    """
    delivered: DeliveredCredential | None = None
    reason = "reserved" if (not isinstance(name, str) or _is_reserved(name)) else "missing"
    try:
        with transaction.atomic():
            credential = None
            if reason != "reserved" and tenant.status not in TENANT_GONE:
                credential = Credential.objects.select_for_update().filter(tenant=tenant, name=name).first()
            if credential is not None and credential.current_version:
                if credential.revoked_at is not None:
                    reason = "revoked"
                elif credential.consumed_at is not None:
                    reason = "consumed"
                else:
                    version, value = _open_current(tenant, credential)
                    now = timezone.now()
                    credential.last_used_at = now
                    if credential.one_time:
                        credential.consumed_at = now
                    credential.save(update_fields=["last_used_at", "consumed_at", "updated_at"])
                    audit_record(
                        actor=actor, action=AuditAction.CREDENTIAL_DELIVER, target=credential, tenant=tenant,
                        data={"name": name, "version": version, "one_time": credential.one_time},
                    )
                    delivered = DeliveredCredential(name=name, version=version, value=value)
    except DecryptionFailed:
        audit_record(actor=actor, action=AuditAction.SECURITY_DECRYPTION_FAILED, tenant=tenant, data={"name": name})
        log.warning("security event: credential %r of tenant %s failed authentication", name, tenant.pk)
        raise
    if delivered is None:
        _record_refused_delivery(tenant=tenant, name=str(name)[:100], actor=actor, reason=reason)
        raise NotFound("credential not found")
    return delivered


def _record_refused_delivery(*, tenant: Tenant, name: str, actor: Actor, reason: str) -> None:
    owners = []
    if reason in ("missing", "reserved"):
        owners = [str(t) for t in Credential.objects.filter(name=name).exclude(tenant=tenant)
                  .values_list("tenant_id", flat=True)[:10]]
    if owners:
        audit_record(
            actor=actor, action=AuditAction.SECURITY_CROSS_TENANT_ATTEMPT, tenant=tenant,
            data={"name": name, "owner_tenant_ids": owners},
        )
        log.warning("security event: instance %s of tenant %s asked for another tenant's credential %r",
                    actor.id, tenant.pk, name)
    else:
        audit_record(actor=actor, action=AuditAction.CREDENTIAL_DELIVER_REFUSED, tenant=tenant,
                     data={"name": name, "reason": reason})


def credential_revoke(*, tenant: Tenant, name: str, actor: Actor) -> Credential:
    if not isinstance(name, str) or (_is_reserved(name) and actor.kind != ActorKind.SYSTEM):
        raise NotFound("credential not found")
    with transaction.atomic():
        credential = Credential.objects.select_for_update().filter(tenant=tenant, name=name).first()
        if credential is None or credential.revoked_at is not None:
            raise NotFound(f"credential {name!r} not found")
        credential.revoked_at = timezone.now()
        credential.save(update_fields=["revoked_at", "updated_at"])
        audit_record(actor=actor, action=AuditAction.CREDENTIAL_REVOKE, target=credential, tenant=tenant,
                     data={"name": name})
    return credential


def credential_destroy(*, tenant: Tenant, name: str, actor: Actor) -> int:
    """Delete every version's ciphertext of ``name`` and mark it revoked; the number of versions deleted (0 when
    there is nothing left, so a retried call is harmless). For values whose owner asked for them to be gone (a
    disconnected account's tokens).

    Deletion, not crypto-shredding: the vault seals with the tenant's data key, not a key per credential, so a
    database backup taken before this still holds ciphertexts that key opens, until the tenant's credentials key
    is rotated and the retired key destroyed (``data_keys_shred``, docs/vault.md)."""
    if not isinstance(name, str) or (_is_reserved(name) and actor.kind != ActorKind.SYSTEM):
        raise NotFound("credential not found")
    with transaction.atomic():
        credential = Credential.objects.select_for_update().filter(tenant=tenant, name=name).first()
        if credential is None:
            return 0
        deleted, _ = CredentialVersion.objects.filter(credential=credential).delete()
        if credential.revoked_at is None:
            credential.revoked_at = timezone.now()
            credential.save(update_fields=["revoked_at", "updated_at"])
        if deleted:
            audit_record(actor=actor, action=AuditAction.CREDENTIAL_DESTROY, target=credential, tenant=tenant,
                         data={"name": name, "versions": deleted})
    return deleted
