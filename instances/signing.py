"""The control plane's side of the instance API signature (docs/instance-api.md, "Authentication").

Our own implementation of the documented scheme: the control plane never imports ``agent_runtime``.
Pure functions, no I/O; nothing here logs or formats a key or a token.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["SCHEME", "KEY_CONTEXT", "SIGNATURE_TTL_S", "signing_key", "canonical_string", "signature", "sign"]

SCHEME = "CP-HMAC-SHA256"
KEY_CONTEXT = b"agent-runtime instance-api v1"
SIGNATURE_TTL_S = 60


def signing_key(instance_token: str) -> bytes:
    """``HMAC-SHA256(key=<instance token>, msg="agent-runtime instance-api v1")``."""
    return hmac.new(instance_token.encode(), KEY_CONTEXT, hashlib.sha256).digest()


def canonical_string(method: str, path_and_query: str, tenant_id: str, expires: int, body: bytes) -> bytes:
    return "\n".join(
        ("v1", method.upper(), path_and_query, tenant_id, str(expires), hashlib.sha256(body).hexdigest())
    ).encode()


def signature(key: bytes, method: str, path_and_query: str, tenant_id: str, expires: int, body: bytes) -> str:
    return hmac.new(key, canonical_string(method, path_and_query, tenant_id, expires, body), hashlib.sha256).hexdigest()


def sign(instance_token: str | bytes, tenant_id: str, method: str, path_and_query: str, body: bytes = b"",
         *, now: float | None = None) -> str:
    """The ``Authorization`` header value for one request.

    ``instance_token`` may be the token itself (str) or the key already derived from it (bytes), so a
    caller can cache the key instead of the token.
    """
    key = instance_token if isinstance(instance_token, bytes) else signing_key(instance_token)
    expires = int(time.time() if now is None else now) + SIGNATURE_TTL_S
    sig = signature(key, method, path_and_query, tenant_id, expires, body)
    return f"{SCHEME} tenant={tenant_id}, expires={expires}, signature={sig}"
