"""Signed webhooks, following the Standard Webhooks specification (standardwebhooks.com).

Each delivery carries `webhook-id` (the idempotency key), `webhook-timestamp` and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 of "id.timestamp.body" under the shared secret). Receivers are required to
de-duplicate by `webhook-id`, which is what makes a repeat with the same id safe (`replay_safe`): an
in-doubt delivery is sent again with the same id and signature scheme, and the receiver acts once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from typing import Any

from agent_runtime.effects.base import LookupResult, ProviderRejected, ProviderUnreachable
from agent_runtime.effects.http import _unreached

__all__ = ["WebhookEffect", "sign_webhook", "verify_webhook"]


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(_secret_bytes(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_webhook(secret: str, headers: dict[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """What a receiver runs: signature valid and timestamp fresh (replayed captures are refused)."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, ts = lower["webhook-id"], int(lower["webhook-timestamp"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    expected = sign_webhook(secret, msg_id, ts, body).split(",", 1)[1]
    return any(hmac.compare_digest(expected, sig.split(",", 1)[-1]) for sig in lower.get("webhook-signature",
                                                                                          "").split())


class WebhookEffect:
    """POST `args` as JSON to `url`, signed with the credential named `secret_credential`."""

    supports_lookup = False
    replay_safe = True
    lookup_consistency_s = 0.0

    def __init__(self, url: str, *, credentials: Any, secret_credential: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.credentials = credentials
        self.secret_credential = secret_credential
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"WebhookEffect({self.url!r})"

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(args, separators=(",", ":")).encode()
        ts = int(time.time())
        secret = self.credentials.get(self.secret_credential).value
        req = urllib.request.Request(  # noqa: S310 - configured receiver
            self.url, data=body, method="POST",
            headers={"Content-Type": "application/json", "webhook-id": idem_key, "webhook-timestamp": str(ts),
                     "webhook-signature": sign_webhook(secret, idem_key, ts, body), "Idempotency-Key": idem_key})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return {"webhook_id": idem_key, "status": resp.status}
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in (408, 409, 429):
                raise ProviderRejected(f"receiver refused with {exc.code}") from exc
            raise
        except urllib.error.URLError as exc:
            if _unreached(exc):
                raise ProviderUnreachable(str(exc.reason)) from exc
            raise

    def lookup(self, idem_key: str) -> LookupResult:  # pragma: no cover - supports_lookup is False
        return LookupResult.unknown("webhooks cannot be looked up")
