"""Checking the control plane's signature on an instance API request (docs/instance-api.md, "Authentication").

Only the control plane holds this instance's token besides the instance itself, so only it can sign. The
signature binds method, path with query, tenant, expiry and body; it is checked in constant time, and a
refusal never says which part was wrong. No I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

__all__ = ["SCHEME", "signing_key", "verify"]

SCHEME = "CP-HMAC-SHA256"
KEY_LABEL = b"agent-runtime instance-api v1"
MAX_AHEAD_S = 300
_HEADER = re.compile(r"^CP-HMAC-SHA256 tenant=([0-9a-fA-F-]{36}), expires=(\d{1,12}), signature=([0-9a-f]{64})$")


def signing_key(instance_token: str) -> bytes:
    return hmac.new(instance_token.encode(), KEY_LABEL, hashlib.sha256).digest()


def canonical(method: str, path_and_query: str, tenant: str, expires: int, body: bytes) -> bytes:
    return "\n".join(("v1", method.upper(), path_and_query, tenant, str(expires),
                      hashlib.sha256(body).hexdigest())).encode()


def verify(key: bytes | None, tenant_id: str, header: str | None, method: str, path_and_query: str, body: bytes,
           now: float | None = None) -> bool:
    """True only for a live signature by `key` over this exact request, for this instance's tenant."""
    if key is None or not header or len(header) > 300:
        return False
    m = _HEADER.match(header.strip())
    if m is None:
        return False
    tenant, expires, signature = m.group(1).lower(), int(m.group(2)), m.group(3)
    t = time.time() if now is None else now
    expected = hmac.new(key, canonical(method, path_and_query, tenant, expires, body), hashlib.sha256).hexdigest()
    # Every check runs, and the signature compare is constant-time, whatever failed first.
    ok_sig = hmac.compare_digest(expected, signature)
    return ok_sig and tenant == tenant_id.lower() and t <= expires <= t + MAX_AHEAD_S
