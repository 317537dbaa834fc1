"""Key-encryption-key providers: wrap and unwrap per-tenant data keys.

``local``: a key ring from ``VAULT_KEK_KEYRING`` ("v1:<base64>,v2:<base64>"); the
newest version wraps, every version unwraps. Without the setting, a development
ring is generated under ``var/secrets`` (never for production: settings say so).
``aws-kms``: boto3 KMS Encrypt/Decrypt with the tenant id as encryption context.

The configured provider wraps; unwrapping dispatches on the wrapped key's ``kek_id``
(``local:<version>`` or ``aws-kms:<key ARN>``), so a key ring can be rotated, or the
deployment moved from ``local`` to ``aws-kms``, while older wrappings still open.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from controlplane.errors import DecryptionFailed, VaultError

from .envelope import KEY_BYTES, new_key, open_sealed, seal

__all__ = [
    "WrappedKey", "KekProvider", "LocalKeyRing", "AwsKmsProvider", "kek_provider", "kek_unwrap", "parse_keyring",
]


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
        self._arn = key_id if key_id.startswith("arn:") else ""
        self._client = client or boto3.client(
            "kms", endpoint_url=settings.AWS_ENDPOINT_URL, region_name=getattr(settings, "VAULT_KMS_REGION", None)
        )

    def current_kek_id(self) -> str:
        # The ARN, not an alias: it is what Encrypt reports, so "already wrapped under this key"
        # checks in rotation compare like with like.
        if not self._arn:
            self._arn = self._call("DescribeKey", KeyId=self._key_id)["KeyMetadata"]["Arn"]
        return f"aws-kms:{self._arn}"

    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey:
        out = self._call("Encrypt", KeyId=self._key_id, Plaintext=data_key, EncryptionContext={"tenant": tenant_id})
        return WrappedKey(f"aws-kms:{out['KeyId']}", out["CiphertextBlob"])

    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes:
        out = self._call(
            "Decrypt", CiphertextBlob=wrapped.blob, KeyId=wrapped.kek_id.removeprefix("aws-kms:"),
            EncryptionContext={"tenant": tenant_id},
        )
        return out["Plaintext"]

    def _call(self, operation: str, **kwargs: object) -> dict:  # type: ignore[type-arg]
        from botocore.exceptions import BotoCoreError, ClientError

        method = {"DescribeKey": "describe_key", "Encrypt": "encrypt", "Decrypt": "decrypt"}[operation]
        try:
            return getattr(self._client, method)(**kwargs)  # type: ignore[no-any-return]
        except ClientError as exc:
            # The error code only: KMS messages can echo request fields.
            if exc.response["Error"]["Code"] == "InvalidCiphertextException":
                raise DecryptionFailed(
                    "KMS refused to unwrap the data key (wrong tenant context, wrong key, or tampered)"
                ) from None
            raise VaultError(f"KMS refused {operation}: {exc.response['Error']['Code']}") from None
        except BotoCoreError as exc:
            raise VaultError(f"KMS unreachable during {operation}: {type(exc).__name__}") from None


def _dev_keyring_spec() -> str:
    path = settings.VAR_DIR / "secrets" / "vault-keyring"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text("v1:" + base64.b64encode(new_key()).decode())
        path.chmod(0o600)
    return path.read_text().strip()


@functools.cache
def _provider_for(
    kind: str, spec: str, kms_key_id: str, endpoint_url: str | None, region: str | None
) -> KekProvider:
    if kind == "local":
        return LocalKeyRing(parse_keyring(spec or _dev_keyring_spec()))
    if kind == "aws-kms":
        if not kms_key_id:
            raise VaultError("VAULT_KMS_KEY_ID must be set when VAULT_KEK_PROVIDER=aws-kms")
        return AwsKmsProvider(kms_key_id)
    raise VaultError(f"unknown VAULT_KEK_PROVIDER {kind!r} (expected 'local' or 'aws-kms')")


def _provider(kind: str, kms_key_id: str) -> KekProvider:
    return _provider_for(
        kind, settings.VAULT_KEK_KEYRING, kms_key_id, settings.AWS_ENDPOINT_URL,
        getattr(settings, "VAULT_KMS_REGION", None),
    )


def kek_provider() -> KekProvider:
    """The configured provider, which wraps new data keys (cached per configuration)."""
    return _provider(settings.VAULT_KEK_PROVIDER, settings.VAULT_KMS_KEY_ID)


def kek_unwrap(tenant_id: str, wrapped: WrappedKey) -> bytes:
    """Unwrap with whichever provider wrapped it, named by the kek id (not the configured provider)."""
    if wrapped.kek_id.startswith("local:"):
        return _provider("local", "").unwrap(tenant_id, wrapped)
    if wrapped.kek_id.startswith("aws-kms:"):
        return _provider("aws-kms", wrapped.kek_id.removeprefix("aws-kms:")).unwrap(tenant_id, wrapped)
    raise VaultError(f"data key wrapped by an unknown key-encryption key kind: {wrapped.kek_id!r}")
