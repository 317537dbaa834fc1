"""Webhook signatures: Standard Webhooks (https://www.standardwebhooks.com), the one scheme for all we send.

Every request carries ``webhook-id`` (the event id: the same on every retry and replay, the receiver's
de-duplication key), ``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``:
``v1,`` + base64 HMAC-SHA256 over ``"{id}.{timestamp}.{raw body}"``, a space-separated list when there are
several. The HMAC key is the secret's part after ``whsec_``, base64-decoded. The agent runtime signs its
webhook effect with its own implementation of the same rule (``agent_runtime.effects.webhook``; the control
plane never imports it); both pass the vectors in ``tests/vectors/standard_webhooks.json``.

Pure functions: no I/O, no key storage.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping

__all__ = ["ID_HEADER", "TIMESTAMP_HEADER", "SIGNATURE_HEADER", "SECRET_PREFIX", "SECRET_BYTES", "TOLERANCE_S",
           "new_secret", "secret_key", "sign", "signed_headers", "verify"]

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the spec asks for 24 to 64 random bytes
TOLERANCE_S = 300


def new_secret() -> str:
    """``whsec_`` + standard base64 of 32 random bytes: what any Standard Webhooks library accepts."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for. The base64 is the standard alphabet (``+/``), padding
    optional; anything else is a ``ValueError`` rather than some other key (a secret is never reinterpreted)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret is 'whsec_' followed by base64")
    tail = secret[len(SECRET_PREFIX):]
    try:
        key = base64.b64decode(tail + "=" * (-len(tail) % 4), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("a webhook secret may not be empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``webhook-signature`` entry: ``v1,<base64>``."""
    mac = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signature = sign(secret, msg_id, timestamp, body)
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature}


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, now: float,
           tolerance_s: float = TOLERANCE_S) -> bool:
    """What a receiver runs: one ``v1`` signature matches (constant time) and the timestamp is within
    ``tolerance_s`` of ``now`` either way (a captured request cannot be replayed later)."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, timestamp = lower.get(ID_HEADER, ""), lower.get(TIMESTAMP_HEADER, "")
    if not msg_id or not (timestamp.isascii() and timestamp.isdigit()) or abs(now - int(timestamp)) > tolerance_s:
        return False
    expected = sign(secret, msg_id, int(timestamp), body).encode()
    found = False
    for entry in lower.get(SIGNATURE_HEADER, "").split():
        version, _, value = entry.partition(",")
        found |= version == "v1" and hmac.compare_digest(expected, f"v1,{value}".encode())
    return found
