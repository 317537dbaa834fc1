"""AES-256-GCM sealing with associated data. Pure functions: no I/O, no key storage.

Associated data binds a ciphertext to where it belongs (tenant, credential name,
version): the same bytes copied to another row or tenant fail authentication.
"""

from __future__ import annotations

import functools
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.errors import DecryptionFailed

__all__ = [
    "NONCE_BYTES", "KEY_BYTES", "new_key", "seal", "open_sealed", "credential_aad", "object_aad", "cipher_cache_clear",
]

NONCE_BYTES = 12
KEY_BYTES = 32


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


@functools.lru_cache(maxsize=4096)
def _aead(key: bytes) -> AESGCM:
    # Building the cipher context costs about as much as sealing a small value; data keys repeat.
    return AESGCM(key)


def cipher_cache_clear() -> None:
    _aead.cache_clear()


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """Return nonce || ciphertext+tag."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + _aead(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes:
    if len(blob) < NONCE_BYTES + 16:
        raise DecryptionFailed("ciphertext is truncated")
    try:
        return _aead(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except InvalidTag:
        raise DecryptionFailed(
            "ciphertext failed authentication (tampered, moved to another record, or wrong key)"
        ) from None


def credential_aad(tenant_id: str, name: str, version: int) -> bytes:
    return f"credential|{tenant_id}|{name}|{version}".encode()


def object_aad(tenant_id: str, key: str) -> bytes:
    return f"object|{tenant_id}|{key}".encode()
