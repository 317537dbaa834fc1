"""Envelope encryption bound to its place: moved or altered ciphertexts fail loudly and return nothing."""

from __future__ import annotations

import pytest
from django.db.models import F

from controlplane.errors import DecryptionFailed
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.choices import KeyPurpose
from vault.envelope import credential_aad, open_sealed, seal
from vault.kek import WrappedKey, kek_provider, kek_unwrap
from vault.models import CredentialVersion, TenantDataKey
from vault.services import credential_put, credential_reveal, tenant_object_key

pytestmark = pytest.mark.django_db

VALUE_A = "sk-tenant-A-7f3e9c1d"
VALUE_B = "sk-tenant-B-2b8a4f6e"


def _row(tenant, name: str) -> CredentialVersion:  # type: ignore[no-untyped-def]
    return CredentialVersion.objects.get(credential__tenant=tenant, credential__name=name)


def _swap(a: CredentialVersion, b: CredentialVersion) -> None:
    ca, cb = bytes(a.ciphertext), bytes(b.ciphertext)
    CredentialVersion.objects.filter(pk=a.pk).update(ciphertext=cb)
    CredentialVersion.objects.filter(pk=b.pk).update(ciphertext=ca)


@pytest.fixture
def two_tenants(operator):  # type: ignore[no-untyped-def]
    a, b = make_tenant(operator, "tenant-a"), make_tenant(operator, "tenant-b")
    credential_put(tenant=a, name="llm-key", value=VALUE_A, actor=SYSTEM)
    credential_put(tenant=b, name="llm-key", value=VALUE_B, actor=SYSTEM)
    assert credential_reveal(tenant=a, name="llm-key", actor=SYSTEM) == VALUE_A
    assert credential_reveal(tenant=b, name="llm-key", actor=SYSTEM) == VALUE_B
    return a, b


def test_ciphertext_swapped_between_tenants_fails(two_tenants):
    a, b = two_tenants
    _swap(_row(a, "llm-key"), _row(b, "llm-key"))
    for tenant in (a, b):
        with pytest.raises(DecryptionFailed) as info:
            credential_reveal(tenant=tenant, name="llm-key", actor=SYSTEM)
        assert VALUE_A not in str(info.value) and VALUE_B not in str(info.value)


def test_ciphertext_swapped_between_names_fails(operator):
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="mail-password", value=VALUE_A, actor=SYSTEM)
    credential_put(tenant=tenant, name="stripe-key", value=VALUE_B, actor=SYSTEM)
    _swap(_row(tenant, "mail-password"), _row(tenant, "stripe-key"))
    for name in ("mail-password", "stripe-key"):
        with pytest.raises(DecryptionFailed):
            credential_reveal(tenant=tenant, name=name, actor=SYSTEM)


def test_ciphertext_moved_to_another_version_fails(operator):
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="token", value=VALUE_A, actor=SYSTEM)
    credential_put(tenant=tenant, name="token", value=VALUE_B, actor=SYSTEM)
    v1 = CredentialVersion.objects.get(credential__tenant=tenant, version=1)
    CredentialVersion.objects.filter(credential__tenant=tenant, version=2).update(ciphertext=bytes(v1.ciphertext))
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=tenant, name="token", actor=SYSTEM)


@pytest.mark.parametrize("position", [0, 5, 11, 12, 20, -17, -1])  # nonce, body and tag bytes
def test_one_flipped_byte_fails(operator, position):
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="token", value=VALUE_A, actor=SYSTEM)
    row = _row(tenant, "token")
    blob = bytearray(bytes(row.ciphertext))
    blob[position] ^= 0x01
    CredentialVersion.objects.filter(pk=row.pk).update(ciphertext=bytes(blob))
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=tenant, name="token", actor=SYSTEM)


def test_truncated_ciphertext_fails(operator):
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="token", value=VALUE_A, actor=SYSTEM)
    CredentialVersion.objects.filter(credential__tenant=tenant).update(ciphertext=b"\x00" * 10)
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=tenant, name="token", actor=SYSTEM)


def test_wrapped_data_keys_swapped_between_tenants_fail(two_tenants):
    a, b = two_tenants
    ka = TenantDataKey.objects.get(tenant=a, purpose=KeyPurpose.CREDENTIALS)
    kb = TenantDataKey.objects.get(tenant=b, purpose=KeyPurpose.CREDENTIALS)
    TenantDataKey.objects.filter(pk=ka.pk).update(wrapped_key=bytes(kb.wrapped_key))
    TenantDataKey.objects.filter(pk=kb.pk).update(wrapped_key=bytes(ka.wrapped_key))
    # The in-process key cache is keyed by the wrapped bytes, so it cannot mask the swap.
    for tenant in (a, b):
        with pytest.raises(DecryptionFailed):
            credential_reveal(tenant=tenant, name="llm-key", actor=SYSTEM)


def test_data_key_version_pointer_moved_fails(operator):
    """Pointing a row at another data-key version (same tenant) fails too: wrong key, tag mismatch."""
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="token", value=VALUE_A, actor=SYSTEM)
    wrapped = kek_provider().wrap(str(tenant.pk), bytes(32))
    TenantDataKey.objects.create(tenant=tenant, purpose=KeyPurpose.CREDENTIALS, version=2, kek_id=wrapped.kek_id,
                                 wrapped_key=wrapped.blob, status="retired")
    CredentialVersion.objects.filter(credential__tenant=tenant).update(data_key_version=F("data_key_version") + 1)
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=tenant, name="token", actor=SYSTEM)


def test_local_kek_binds_the_wrapped_key_to_its_tenant(operator):
    a, b = make_tenant(operator), make_tenant(operator)
    wrapped = kek_provider().wrap(str(a.pk), b"k" * 32)
    assert kek_unwrap(str(a.pk), wrapped) == b"k" * 32
    with pytest.raises(DecryptionFailed):
        kek_unwrap(str(b.pk), wrapped)
    with pytest.raises(DecryptionFailed):
        kek_unwrap(str(a.pk), WrappedKey(wrapped.kek_id, wrapped.blob[:-1] + bytes([wrapped.blob[-1] ^ 1])))


def test_object_keys_differ_per_tenant_and_bind_objects(operator):
    a, b = make_tenant(operator), make_tenant(operator)
    key_a, key_b = tenant_object_key(tenant=a), tenant_object_key(tenant=b)
    assert key_a != key_b and len(key_a) == 32
    blob = seal(key_a, b"object bytes", credential_aad(str(a.pk), "x", 1))
    with pytest.raises(DecryptionFailed):
        open_sealed(key_b, blob, credential_aad(str(a.pk), "x", 1))


def test_delivery_of_a_tampered_credential_is_a_problem_without_the_value(two_tenants):
    a, b = two_tenants
    token = make_instance(a)
    _swap(_row(a, "llm-key"), _row(b, "llm-key"))
    resp = bearer_client(token).get("/internal/v1/credentials/llm-key")
    body = assert_problem(resp, 500)
    assert body["type"].endswith("decryption-failed")
    assert VALUE_A.encode() not in resp.content and VALUE_B.encode() not in resp.content
    assert AuditLog.objects.filter(action="security.decryption_failed", tenant=a).exists()
    assert not AuditLog.objects.filter(action="credential.deliver", tenant=a).exists()
