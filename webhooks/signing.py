"""Webhook signatures, Stripe-style: ``Webhook-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``.

The HMAC key is the endpoint's secret (``whsec_...``, as shown once) and the message is ``<t>.<raw body>``,
so a captured body cannot be re-sent with a fresh timestamp. Pure functions: no I/O, no key storage.
Receivers verify with the same rule (``examples/webhook_receiver.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["SIGNATURE_HEADER", "ID_HEADER", "SECRET_PREFIX", "new_secret", "signature", "signature_header",
           "signature_verify"]

SIGNATURE_HEADER = "Webhook-Signature"
ID_HEADER = "Webhook-Id"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={signature(secret, timestamp, body)}"


def signature_verify(secret: str, header: str, body: bytes, *, now: float, tolerance_s: float = 300) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance_s`` of ``now`` (constant time)."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        parts.setdefault(key, []).append(value)
    try:
        timestamp = int(parts.get("t", [""])[0])
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in parts.get("v1", []))
