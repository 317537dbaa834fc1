"""Concrete irreversible effects for the demo agent: email over SMTP and a payment over HTTP.

Both pass the ledger's idempotency key to the provider (Message-ID / Idempotency-Key) and support
lookup by that key, which is how in-doubt intents are resolved without a blind retry.
"""

from __future__ import annotations

import json
import smtplib
import urllib.error
import urllib.request
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlparse

from agent_runtime.ledger import ProviderRejected

__all__ = ["EmailEffect", "PaymentEffect"]


class EmailEffect:
    supports_lookup = True

    def __init__(self, smtp_url: str, name: str = "email", timeout_s: float = 5.0) -> None:
        parsed = urlparse(smtp_url)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 25
        self.name = name
        self.timeout_s = timeout_s

    def _message_id(self, idem_key: str) -> str:
        return f"<{idem_key}@agent-runtime>"

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        msg = EmailMessage()
        msg["From"] = args["from"]
        msg["To"] = args["to"]
        msg["Subject"] = args["subject"]
        msg["Message-ID"] = self._message_id(idem_key)
        msg.set_content(args["body"])
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
            try:
                refused = smtp.send_message(msg)
            except smtplib.SMTPRecipientsRefused as exc:
                raise ProviderRejected(f"recipients refused: {list(exc.recipients)}") from exc
        return {"message_id": msg["Message-ID"], "refused": sorted(refused)}

    def lookup(self, idem_key: str) -> dict[str, Any] | None:
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
            code, text = smtp.docmd("XLOOKUP", self._message_id(idem_key))
        if code == 250:
            found = json.loads(text.decode())
            return {"message_id": found["message_id"], "refused": [], "resolved_by": "lookup"}
        return None


class PaymentEffect:
    supports_lookup = True

    def __init__(self, payments_url: str, name: str = "payment", timeout_s: float = 5.0) -> None:
        self.base = payments_url.rstrip("/")
        self.name = name
        self.timeout_s = timeout_s

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(  # noqa: S310 - configured provider URL
            f"{self.base}/v1/payments", data=json.dumps(args).encode(), method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": idem_key},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                raise ProviderRejected(f"payment refused with {exc.code}: {exc.read()[:200]!r}") from exc
            raise

    def lookup(self, idem_key: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.base}/v1/payments/by-key/{idem_key}",  # noqa: S310
                                        timeout=self.timeout_s) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
