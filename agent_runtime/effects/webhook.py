"""Signed webhooks, following the Standard Webhooks specification (standardwebhooks.com).

Each delivery carries `webhook-id` (the idempotency key), `webhook-timestamp` and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 of "id.timestamp.body"; the key is the secret's base64 part after `whsec_`,
decoded). Receivers are required to de-duplicate by `webhook-id`, which is what makes a repeat with the same
id safe (`replay_safe`): an in-doubt delivery is sent again with the same id and signature scheme, and the
receiver acts once. The control plane signs its operator webhooks with its own implementation of the same
rule (`webhooks.signing`: the runtime never imports it); both pass `tests/vectors/standard_webhooks.json`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from agent_runtime.effects.base import LookupResult, ProviderRejected, ProviderUnreachable
from agent_runtime.effects.http import _unreached

__all__ = ["WebhookEffect", "sign_webhook", "verify_webhook", "webhook_secret_key"]

SECRET_PREFIX = "whsec_"


def webhook_secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_` secret: its tail, standard base64 (padding optional). Anything else is a
    `ValueError`, never some other key."""
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


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(webhook_secret_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes, tolerance_s: int = 300,
                   now: float | None = None) -> bool:
    """What a receiver runs: a `v1` signature matches (constant time) and the timestamp is fresh, either way
    (replayed captures are refused)."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, ts = lower.get("webhook-id", ""), lower.get("webhook-timestamp", "")
    if not msg_id or not (ts.isascii() and ts.isdigit()):
        return False
    if abs((time.time() if now is None else now) - int(ts)) > tolerance_s:
        return False
    expected = sign_webhook(secret, msg_id, int(ts), body).encode()
    found = False
    for entry in lower.get("webhook-signature", "").split():
        version, _, value = entry.partition(",")
        found |= version == "v1" and hmac.compare_digest(expected, f"v1,{value}".encode())
    return found


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
        try:
            signature = sign_webhook(secret, idem_key, ts, body)
        except ValueError as exc:  # nothing was sent: a malformed secret fails the effect, it is not in doubt
            raise ProviderRejected(f"credential {self.secret_credential!r}: {exc}") from None
        req = urllib.request.Request(  # noqa: S310 - configured receiver
            self.url, data=body, method="POST",
            headers={"Content-Type": "application/json", "webhook-id": idem_key, "webhook-timestamp": str(ts),
                     "webhook-signature": signature, "Idempotency-Key": idem_key})
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
