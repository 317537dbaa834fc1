"""Key-encryption-key providers: wrap and unwrap per-tenant data keys.

``local``: a key ring from ``VAULT_KEK_KEYRING`` ("v1:<base64>,v2:<base64>"); the
newest version wraps, every version unwraps. Without the setting, a development
ring is generated under ``var/secrets`` exactly once (``controlplane.secretfiles``: every
process uses what is on disk) and re-checked before each wrap; never for production.
``aws-kms``: boto3 KMS Encrypt/Decrypt with the tenant id as encryption context.

The configured provider wraps; unwrapping dispatches on the wrapped key's ``kek_id``
(``local:<version>`` or ``aws-kms:<key ARN>``), so a key ring can be rotated, or the
deployment moved from ``local`` to ``aws-kms``, while older wrappings still open. Every
wrapping records the fingerprint of the key that made it, so a process holding another
key ring says so (``KeyRingMismatch``) instead of reporting tampering.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings

from controlplane.errors import DecryptionFailed, KeyRingMismatch, VaultError
from controlplane.secretfiles import DEV_KEYRING_FILE, DEV_SECRETS, SecretFileError, read_or_create_secret

from .envelope import KEY_BYTES, open_sealed, seal

__all__ = [
    "WrappedKey", "KekProvider", "LocalKeyRing", "AwsKmsProvider", "kek_provider", "kek_unwrap",
    "kek_assert_persisted", "kek_fingerprint", "kms_fingerprint", "parse_keyring", "dev_keyring_path",
]

log = logging.getLogger(__name__)

# Fingerprints name a key-encryption key without revealing it: a fixed label keeps them from being
# a plain hash of the key, and 16 hex digits (64 bits) are plenty to tell key rings apart.
_FINGERPRINT_LABEL = b"agent-control-plane vault kek fingerprint v1\x00"
_KMS_FINGERPRINT_LABEL = b"agent-control-plane vault kms key fingerprint v1\x00"
_SEE_DOCS = "(see docs/vault.md)"


def kek_fingerprint(key: bytes) -> str:
    """First 16 hex digits of SHA-256 over a fixed label and the key bytes (never the key itself)."""
    return hashlib.sha256(_FINGERPRINT_LABEL + key).hexdigest()[:16]


def kms_fingerprint(key_arn: str) -> str:
    """The fingerprint-equivalent of a KMS key: a digest of its ARN (the key never leaves KMS)."""
    return "kms-" + hashlib.sha256(_KMS_FINGERPRINT_LABEL + key_arn.encode()).hexdigest()[:16]


def _not_in_ring(fingerprint: str) -> KeyRingMismatch:
    return KeyRingMismatch(
        f"this process's key ring has no key with fingerprint {fingerprint}: it was wrapped by a key ring "
        f"this process does not have {_SEE_DOCS}"
    )


@dataclass(frozen=True)
class WrappedKey:
    kek_id: str
    blob: bytes
    # Which key-encryption key wrapped it (kek_fingerprint / kms_fingerprint); None for data keys
    # wrapped before fingerprints were recorded, which unwrap by version as they always did.
    fingerprint: str | None = None


class KekProvider(Protocol):
    def current_kek_id(self) -> str: ...
    def current_fingerprint(self) -> str: ...
    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey: ...
    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes: ...
    def assert_persisted(self, wrapped: WrappedKey) -> None: ...


def parse_keyring(spec: str, *, source: str = "VAULT_KEK_KEYRING") -> dict[str, bytes]:
    """Parse "v1:<b64>,v2:<b64>"; errors name the version, never the key material."""
    ring: dict[str, bytes] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        version, sep, b64 = part.partition(":")
        if not sep or not version:
            raise VaultError(f"{source} entries must look like 'v1:<base64 key>'")
        try:
            key = base64.b64decode(b64, validate=True)
        except ValueError:
            raise VaultError(f"{source} version {version!r} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise VaultError(f"{source} version {version!r} must be {KEY_BYTES} bytes")
        ring[version] = key
    if not ring:
        raise VaultError(f"{source} is empty")
    return ring


def _version_order(version: str) -> tuple[int, str]:
    digits = "".join(ch for ch in version if ch.isdigit())
    return (int(digits) if digits else -1, version)


def _newest(ring: dict[str, bytes]) -> str:
    return max(ring, key=_version_order)


_DEV_RING_NAME = f"secrets/{DEV_KEYRING_FILE}"


class _RingFile:
    """The development key ring file, re-read only when it changed (one fstat per check otherwise).

    Files under var/secrets are published whole, never rewritten in place by us, so a change of
    (device, inode, size, mtime) of the open file is what a change of content looks like.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._fingerprints: dict[str, str] = {}  # version -> fingerprint, as on disk
        self._newest = ""

    def fingerprints(self) -> tuple[str, dict[str, str]]:
        """(fingerprint of the newest version, {version: fingerprint}) of the ring on disk now."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise KeyRingMismatch(
                f"the development key ring file ({_DEV_RING_NAME}) this process loaded is gone: restart this "
                f"process {_SEE_DOCS}"
            ) from None
        except OSError as exc:
            raise VaultError(f"the development key ring ({_DEV_RING_NAME}) cannot be read: {type(exc).__name__}") \
                from None
        with os.fdopen(fd, "rb") as fh, self._lock:
            st = os.fstat(fh.fileno())
            seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if seen != self._seen:
                ring = parse_keyring(fh.read().decode(errors="replace"), source=f"the development key ring "
                                     f"({_DEV_RING_NAME})")
                self._fingerprints = {version: kek_fingerprint(key) for version, key in ring.items()}
                self._newest = self._fingerprints[_newest(ring)]
                self._seen = seen
            return self._newest, self._fingerprints


class LocalKeyRing:
    """A key ring held in this process. ``source``: the development ring file it was loaded from,
    which is checked before every wrap (a process never wraps with a key that is not on disk)."""

    def __init__(self, ring: dict[str, bytes], *, source: Path | None = None) -> None:
        self._ring = ring
        self._current = _newest(ring)
        self._fingerprints = {version: kek_fingerprint(key) for version, key in ring.items()}
        self._by_fingerprint = {fp: version for version, fp in self._fingerprints.items()}
        self._source = _RingFile(source) if source is not None else None

    def current_kek_id(self) -> str:
        return f"local:{self._current}"

    def current_fingerprint(self) -> str:
        return self._fingerprints[self._current]

    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey:
        fingerprint = self.current_fingerprint()
        if self._source is not None:
            on_disk, _ = self._source.fingerprints()
            if on_disk != fingerprint:
                log.error("vault: key ring of this process (%s) differs from %s (%s); refusing to wrap",
                          fingerprint, self._source.path, on_disk)
                raise KeyRingMismatch(
                    f"this process's key ring (newest key fingerprint {fingerprint}) is not the key ring on disk "
                    f"({_DEV_RING_NAME}, newest key fingerprint {on_disk}): refusing to wrap a data key no other "
                    f"process could unwrap; restart this process {_SEE_DOCS}"
                )
        kek_id = self.current_kek_id()
        blob = seal(self._ring[self._current], data_key, _wrap_aad(tenant_id, kek_id))
        return WrappedKey(kek_id, blob, fingerprint)

    def _key_for(self, wrapped: WrappedKey) -> bytes:
        if wrapped.fingerprint:
            version = self._by_fingerprint.get(wrapped.fingerprint)
            if version is None:
                raise _not_in_ring(wrapped.fingerprint)
            return self._ring[version]
        version = wrapped.kek_id.removeprefix("local:")  # legacy: no fingerprint recorded
        if version not in self._ring:
            raise VaultError(f"key-encryption key {wrapped.kek_id!r} is not in the key ring")
        return self._ring[version]

    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes:
        key = self._key_for(wrapped)
        try:
            return open_sealed(key, wrapped.blob, _wrap_aad(tenant_id, wrapped.kek_id))
        except DecryptionFailed:
            if wrapped.fingerprint:
                raise  # the right key by fingerprint: the wrapped bytes themselves are wrong
            raise DecryptionFailed(
                f"the data key failed authentication under this process's {wrapped.kek_id}: it was tampered with, "
                "moved, or wrapped by another key ring (it predates fingerprints, so these cannot be told apart "
                f"here) {_SEE_DOCS}"
            ) from None

    def assert_persisted(self, wrapped: WrappedKey) -> None:
        """Fail unless the key that wrapped ``wrapped`` is also on disk (development ring only).

        A ring from the environment is the configuration itself; nothing to compare with.
        """
        if self._source is None:
            return
        fingerprint = wrapped.fingerprint or kek_fingerprint(self._key_for(wrapped))
        _, on_disk = self._source.fingerprints()
        if fingerprint not in on_disk.values():
            raise KeyRingMismatch(
                f"the key that wrapped this data key (fingerprint {fingerprint}) is not in the key ring on disk "
                f"({_DEV_RING_NAME}): only this process holds it, and nothing encrypted under it would stay "
                f"readable {_SEE_DOCS}"
            )


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

    def current_fingerprint(self) -> str:
        return kms_fingerprint(self.current_kek_id().removeprefix("aws-kms:"))

    def wrap(self, tenant_id: str, data_key: bytes) -> WrappedKey:
        out = self._call("Encrypt", KeyId=self._key_id, Plaintext=data_key, EncryptionContext={"tenant": tenant_id})
        return WrappedKey(f"aws-kms:{out['KeyId']}", out["CiphertextBlob"], kms_fingerprint(out["KeyId"]))

    def unwrap(self, tenant_id: str, wrapped: WrappedKey) -> bytes:
        arn = wrapped.kek_id.removeprefix("aws-kms:")
        if wrapped.fingerprint and wrapped.fingerprint != kms_fingerprint(arn):
            raise DecryptionFailed(
                f"the data key's fingerprint {wrapped.fingerprint} is not that of the KMS key its record names "
                "(the record was edited, or moved between keys)"
            )
        out = self._call(
            "Decrypt", CiphertextBlob=wrapped.blob, KeyId=arn, EncryptionContext={"tenant": tenant_id},
        )
        return out["Plaintext"]

    def assert_persisted(self, wrapped: WrappedKey) -> None:
        return None  # KMS keys live in KMS, not in a process

    def _call(self, operation: str, **kwargs: object) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        method = {"DescribeKey": "describe_key", "Encrypt": "encrypt", "Decrypt": "decrypt"}[operation]
        try:
            return getattr(self._client, method)(**kwargs)
        except ClientError as exc:
            # The error code only: KMS messages can echo request fields.
            if exc.response["Error"]["Code"] == "InvalidCiphertextException":
                raise DecryptionFailed(
                    "KMS refused to unwrap the data key (wrong tenant context, wrong key, or tampered)"
                ) from None
            raise VaultError(f"KMS refused {operation}: {exc.response['Error']['Code']}") from None
        except BotoCoreError as exc:
            raise VaultError(f"KMS unreachable during {operation}: {type(exc).__name__}") from None


def dev_keyring_path() -> Path:
    return Path(settings.VAR_DIR) / "secrets" / DEV_KEYRING_FILE


def _dev_keyring_spec(path: Path) -> str:
    """The development ring: created once (atomically) by whichever process needs it first.

    Every process, including one whose own generated ring lost the race, uses what is on disk.
    """
    try:
        return read_or_create_secret(path, DEV_SECRETS[DEV_KEYRING_FILE])
    except (OSError, SecretFileError) as exc:
        log.error("vault: development key ring %s unusable: %s", path, exc)
        raise VaultError(
            f"the development key ring ({_DEV_RING_NAME}) cannot be read or created: {type(exc).__name__}"
        ) from None


@functools.cache
def _provider_for(
    kind: str, spec: str, kms_key_id: str, endpoint_url: str | None, region: str | None, dev_path: str
) -> KekProvider:
    if kind == "local":
        if spec:
            return LocalKeyRing(parse_keyring(spec))
        path = Path(dev_path)
        ring = parse_keyring(_dev_keyring_spec(path), source=f"the development key ring ({_DEV_RING_NAME})")
        return LocalKeyRing(ring, source=path)
    if kind == "aws-kms":
        if not kms_key_id:
            raise VaultError("VAULT_KMS_KEY_ID must be set when VAULT_KEK_PROVIDER=aws-kms")
        return AwsKmsProvider(kms_key_id)
    raise VaultError(f"unknown VAULT_KEK_PROVIDER {kind!r} (expected 'local' or 'aws-kms')")


def _provider(kind: str, kms_key_id: str) -> KekProvider:
    spec = settings.VAULT_KEK_KEYRING
    return _provider_for(
        kind, spec, kms_key_id, settings.AWS_ENDPOINT_URL, getattr(settings, "VAULT_KMS_REGION", None),
        "" if spec or kind != "local" else str(dev_keyring_path()),
    )


def kek_provider() -> KekProvider:
    """The configured provider, which wraps new data keys (cached per configuration)."""
    return _provider(settings.VAULT_KEK_PROVIDER, settings.VAULT_KMS_KEY_ID)


def _provider_of(wrapped: WrappedKey) -> KekProvider:
    if wrapped.kek_id.startswith("local:"):
        return _provider("local", "")
    if wrapped.kek_id.startswith("aws-kms:"):
        return _provider("aws-kms", wrapped.kek_id.removeprefix("aws-kms:"))
    raise VaultError(f"data key wrapped by an unknown key-encryption key kind: {wrapped.kek_id!r}")


def kek_unwrap(tenant_id: str, wrapped: WrappedKey) -> bytes:
    """Unwrap with whichever provider wrapped it, named by the kek id (not the configured provider)."""
    return _provider_of(wrapped).unwrap(tenant_id, wrapped)


def kek_assert_persisted(wrapped: WrappedKey) -> None:
    """Fail (KeyRingMismatch) if only this process holds the key that wrapped ``wrapped``.

    For steps that are about to delete the last other copy of something encrypted under it.
    """
    _provider_of(wrapped).assert_persisted(wrapped)
