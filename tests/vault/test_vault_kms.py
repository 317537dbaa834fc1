"""The aws-kms provider against moto's KMS server over HTTP (boto3 talks to a real socket)."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from controlplane.errors import DecryptionFailed, VaultError
from controlplane.ports import free_port
from tenants.actors import SYSTEM
from tests.vault.test_vault_helpers import make_tenant
from vault.kek import AwsKmsProvider, WrappedKey, kek_provider, kek_unwrap, kms_fingerprint
from vault.models import TenantDataKey
from vault.rotation import kek_rotate_start, rotation_job_execute
from vault.selectors import kek_ids_in_use
from vault.services import credential_put, credential_reveal, tenant_object_key

pytestmark = pytest.mark.django_db

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def kms(moto_url, monkeypatch, settings):  # type: ignore[no-untyped-def]
    """A fresh KMS key on the moto server; settings point the vault at it (provider still local)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.AWS_ENDPOINT_URL = moto_url
    settings.VAULT_KMS_REGION = REGION
    client = boto3.client("kms", endpoint_url=moto_url, region_name=REGION)
    key = client.create_key(Description="vault test KEK")["KeyMetadata"]
    client.create_alias(AliasName=f"alias/vault-{key['KeyId'][:8]}", TargetKeyId=key["KeyId"])
    return client, key


def _use_kms(settings, key_id: str) -> None:  # type: ignore[no-untyped-def]
    settings.VAULT_KEK_PROVIDER = "aws-kms"
    settings.VAULT_KMS_KEY_ID = key_id


def test_wrap_and_unwrap_over_http(kms, settings, operator):
    client, key = kms
    provider = AwsKmsProvider(key["KeyId"])
    assert provider.current_kek_id() == f"aws-kms:{key['Arn']}"
    wrapped = provider.wrap("tenant-1", b"d" * 32)
    assert wrapped.kek_id == f"aws-kms:{key['Arn']}" and b"d" * 32 not in wrapped.blob
    assert provider.unwrap("tenant-1", wrapped) == b"d" * 32
    # An alias resolves to the same key id, so rotation compares like with like.
    alias = client.list_aliases(KeyId=key["KeyId"])["Aliases"][0]["AliasName"]
    assert AwsKmsProvider(alias).current_kek_id() == provider.current_kek_id()


def test_encryption_context_mismatch_fails(kms):
    _, key = kms
    provider = AwsKmsProvider(key["KeyId"])
    wrapped = provider.wrap("tenant-1", b"d" * 32)
    with pytest.raises(DecryptionFailed):
        provider.unwrap("tenant-2", wrapped)
    tampered = WrappedKey(wrapped.kek_id, wrapped.blob[:-1] + bytes([wrapped.blob[-1] ^ 1]))
    with pytest.raises(VaultError):
        provider.unwrap("tenant-1", tampered)


def test_a_wrapping_relabelled_to_another_kms_key_is_refused(kms):
    client, key = kms
    other = client.create_key(Description="another KEK")["KeyMetadata"]
    wrapped = AwsKmsProvider(key["KeyId"]).wrap("tenant-1", b"d" * 32)
    with pytest.raises(VaultError) as info:
        kek_unwrap("tenant-1", WrappedKey(f"aws-kms:{other['Arn']}", wrapped.blob))
    assert "KMS refused" in str(info.value)


def test_vault_on_kms_binds_data_keys_to_tenants(kms, settings, operator):
    _, key = kms
    _use_kms(settings, key["KeyId"])
    a, b = make_tenant(operator), make_tenant(operator)
    credential_put(tenant=a, name="llm", value="kms-value-a", actor=SYSTEM)
    credential_put(tenant=b, name="llm", value="kms-value-b", actor=SYSTEM)
    assert credential_reveal(tenant=a, name="llm", actor=SYSTEM) == "kms-value-a"
    assert TenantDataKey.objects.get(tenant=a).kek_id == f"aws-kms:{key['Arn']}"
    # The fingerprint-equivalent of a KMS key is a digest of its ARN; a record naming another key is refused.
    row = TenantDataKey.objects.get(tenant=a)
    assert row.kek_fingerprint == kms_fingerprint(key["Arn"]) == AwsKmsProvider(key["KeyId"]).current_fingerprint()
    with pytest.raises(DecryptionFailed, match="not that of the KMS key its record names"):
        kek_unwrap(str(a.pk), WrappedKey(row.kek_id, bytes(row.wrapped_key), kms_fingerprint(key["Arn"] + "x")))
    ka, kb = TenantDataKey.objects.get(tenant=a), TenantDataKey.objects.get(tenant=b)
    TenantDataKey.objects.filter(pk=ka.pk).update(wrapped_key=bytes(kb.wrapped_key))
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=a, name="llm", actor=SYSTEM)


def test_rotation_from_local_key_ring_to_kms(kms, settings, operator):
    _, key = kms
    tenants = [make_tenant(operator) for _ in range(3)]
    for t in tenants:
        credential_put(tenant=t, name="llm", value=f"moving-{t.pk}", actor=SYSTEM)
        tenant_object_key(tenant=t)
    object_keys = {t.pk: tenant_object_key(tenant=t) for t in tenants}
    assert kek_ids_in_use() == ["local:v1"]

    _use_kms(settings, key["KeyId"])
    job = kek_rotate_start(actor=SYSTEM)
    assert job.target == f"aws-kms:{key['Arn']}" and job.total == 6
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    assert kek_ids_in_use() == [f"aws-kms:{key['Arn']}"]

    settings.VAULT_KEK_KEYRING = "v9:" + "A" * 43 + "="  # the old local ring is gone entirely
    for t in tenants:
        assert credential_reveal(tenant=t, name="llm", actor=SYSTEM) == f"moving-{t.pk}"
        row = TenantDataKey.objects.get(tenant=t, purpose="objects")
        assert kek_unwrap(str(t.pk), WrappedKey(row.kek_id, bytes(row.wrapped_key))) == object_keys[t.pk]
    assert kek_provider().current_kek_id() == job.target
