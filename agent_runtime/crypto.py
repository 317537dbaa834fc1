"""Client-side AES-256-GCM for everything the runtime writes to the object store (no I/O here).

The associated data binds each ciphertext to (tenant id, object key name), so a blob copied to another
key or read with another tenant's data key fails to decrypt instead of yielding wrong plaintext.
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent_runtime.errors import ConfigError, CorruptState

_MAGIC = b"ARO1"
_NONCE_LEN = 12


def decode_key(b64: str) -> bytes:
    """Decode `AGENT_OBJECT_KEY` (base64 of 32 bytes)."""
    try:
        key = base64.b64decode(b64, validate=True)
    except ValueError as exc:
        raise ConfigError("AGENT_OBJECT_KEY is not valid base64") from exc
    if len(key) != 32:
        raise ConfigError("AGENT_OBJECT_KEY must decode to exactly 32 bytes (AES-256)")
    return key


def _aad(tenant_id: str, name: str) -> bytes:
    return f"agent_runtime/v1\x00{tenant_id}\x00{name}".encode()


def seal(key: bytes, tenant_id: str, name: str, plaintext: bytes) -> bytes:
    nonce = os.urandom(_NONCE_LEN)
    return _MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, _aad(tenant_id, name))


def open_sealed(key: bytes, tenant_id: str, name: str, blob: bytes) -> bytes:
    if len(blob) < len(_MAGIC) + _NONCE_LEN + 16 or not blob.startswith(_MAGIC):
        raise CorruptState(f"object {name!r} is not a sealed agent_runtime object (truncated?)")
    nonce = blob[len(_MAGIC) : len(_MAGIC) + _NONCE_LEN]
    try:
        return AESGCM(key).decrypt(nonce, blob[len(_MAGIC) + _NONCE_LEN :], _aad(tenant_id, name))
    except InvalidTag as exc:
        raise CorruptState(
            f"object {name!r} failed authentication (wrong tenant key, moved object, or corruption)"
        ) from exc
