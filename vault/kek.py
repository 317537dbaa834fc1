"""Key-encryption-key providers: wrap and unwrap per-tenant data keys.

``local``: a key ring from ``VAULT_KEK_KEYRING`` ("v1:<base64>,v2:<base64>"); the
newest version wraps, every version unwraps. Without the setting, a development
ring is generated under ``var/secrets`` (never for production: settings say so).
``aws-kms``: boto3 KMS Encrypt/Decrypt with the tenant id as encryption context.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from controlplane.errors import VaultError

from .envelope import KEY_BYTES, new_key, open_sealed, seal

__all__ = ["WrappedKey", "KekProvider", "LocalKeyRing", "AwsKmsProvider", "kek_provider", "parse_keyring"]


@dataclass(frozen=True)
class WrappedKey:
    kek_id: str
    blob: bytes


class KekProvider(Protocol):
    def current_kek_id(self) -> str: ...
    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey: ...
    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes: ...


def parse_keyring(spec: str) -> dict[str, bytes]:
    """Parse "v1:<b64>,v2:<b64>"; errors name the version, never the key material."""
    ring: dict[str, bytes] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        version, sep, b64 = part.partition(":")
        if not sep or not version:
            raise VaultError("VAULT_KEK_KEYRING entries must look like 'v1:<base64 key>'")
        try:
            key = base64.b64decode(b64, validate=True)
        except ValueError:
            raise VaultError(f"VAULT_KEK_KEYRING version {version!r} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise VaultError(f"VAULT_KEK_KEYRING version {version!r} must be {KEY_BYTES} bytes")
        ring[version] = key
    if not ring:
        raise VaultError("VAULT_KEK_KEYRING is empty")
    return ring


def _version_order(version: str) -> tuple[int, str]:
    digits = "".join(ch for ch in version if ch.isdigit())
    return (int(digits) if digits else -1, version)


class LocalKeyRing:
    def __init__(self, ring: dict[str, bytes]) -> None:
        self._ring = ring
        self._current = max(ring, key=_version_order)

    def current_kek_id(self) -> str:
        return f"local:{self._current}"

    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey:
        kek_id = self.current_kek_id()
        return WrappedKey(kek_id, seal(self._ring[self._current], data_key, _wrap_aad(tenant_id, kek_id)))

    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes:
        version = wrapped.kek_id.removeprefix("local:")
        if version not in self._ring:
            raise VaultError(f"key-encryption key {wrapped.kek_id!r} is not in the key ring")
        return open_sealed(self._ring[version], wrapped.blob, _wrap_aad(tenant_id, wrapped.kek_id))


def _wrap_aad(tenant_id: str, kek_id: str) -> bytes:
    return f"data-key|{tenant_id}|{kek_id}".encode()


class AwsKmsProvider:
    def __init__(self, key_id: str, client: object | None = None) -> None:
        import boto3

        self._key_id = key_id
        self._client = client or boto3.client("kms", endpoint_url=settings.AWS_ENDPOINT_URL)

    def current_kek_id(self) -> str:
        return f"aws-kms:{self._key_id}"

    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey:
        out = self._client.encrypt(  # type: ignore[attr-defined]
            KeyId=self._key_id, Plaintext=data_key, EncryptionContext={"tenant": tenant_id}
        )
        return WrappedKey(f"aws-kms:{out['KeyId']}", out["CiphertextBlob"])

    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes:
        from botocore.exceptions import ClientError

        try:
            out = self._client.decrypt(  # type: ignore[attr-defined]
                CiphertextBlob=wrapped.blob, EncryptionContext={"tenant": tenant_id}
            )
        except ClientError as exc:
            raise VaultError(f"KMS refused to unwrap the data key: {exc.response['Error']['Code']}") from None
        return out["Plaintext"]


def _dev_keyring_spec() -> str:
    path = settings.VAR_DIR / "secrets" / "vault-keyring"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text("v1:" + base64.b64encode(new_key()).decode())
        path.chmod(0o600)
    return path.read_text().strip()


@functools.cache
def _provider_for(kind: str, spec: str, kms_key_id: str) -> KekProvider:
    if kind == "local":
        return LocalKeyRing(parse_keyring(spec or _dev_keyring_spec()))
    if kind == "aws-kms":
        if not kms_key_id:
            raise VaultError("VAULT_KMS_KEY_ID must be set when VAULT_KEK_PROVIDER=aws-kms")
        return AwsKmsProvider(kms_key_id)
    raise VaultError(f"unknown VAULT_KEK_PROVIDER {kind!r} (expected 'local' or 'aws-kms')")


def kek_provider() -> KekProvider:
    """The configured provider (cached per configuration, so tests can switch settings)."""
    return _provider_for(settings.VAULT_KEK_PROVIDER, settings.VAULT_KEK_KEYRING, settings.VAULT_KMS_KEY_ID)
