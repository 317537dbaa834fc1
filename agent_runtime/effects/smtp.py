"""Email through a standard SMTP relay: no private commands, the idempotency key becomes the Message-ID.

SMTP cannot be asked whether it already accepted a message, so an email whose outcome is unknown (the
connection dropped after the message was sent, before the relay's 250) is blocked for a human, never sent
again — unless a `lookup` is configured (for example a search of the sender's "Sent" folder by Message-ID),
which then decides. What is certain is used: a refused connection or a 4xx before the message was accepted
means it was not sent (tried again later); a 5xx refusal means it never will be.
"""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote, urlparse

from agent_runtime.effects.base import LookupResult, ProviderRejected, ProviderUnreachable

__all__ = ["SmtpEffect", "message_id_for"]


def message_id_for(idem_key: str, domain: str = "agent-runtime.invalid") -> str:
    return f"<{idem_key}@{domain}>"


class SmtpEffect:
    """Send `args` = {from, to (str or list), subject, body[, cc, reply_to]} through `url` (smtp:// or smtps://,
    `?starttls=1`); credentials in the URL's user part name a credential holding the password."""

    replay_safe = False

    def __init__(self, url: str, *, credentials: Any = None, domain: str = "agent-runtime.invalid",
                 lookup: Callable[[str], LookupResult] | None = None, lookup_consistency_s: float = 0.0,
                 timeout_s: float = 10.0) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("smtp", "smtps"):
            raise ValueError(f"SMTP URL must be smtp:// or smtps://, not {parsed.scheme!r}")
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (465 if parsed.scheme == "smtps" else 25)
        self.ssl = parsed.scheme == "smtps"
        self.starttls = "starttls=1" in (parsed.query or "")
        self.username = unquote(parsed.username) if parsed.username else None
        self.password_credential = unquote(parsed.password) if parsed.password else None
        self.credentials = credentials
        self.domain = domain
        self._lookup = lookup
        self.supports_lookup = lookup is not None
        # How long after a send the lookup may still miss it (a mailbox the relay files into with a delay).
        self.lookup_consistency_s = float(lookup_consistency_s)
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"SmtpEffect({self.host}:{self.port}, lookup={self.supports_lookup})"

    def _connect(self) -> smtplib.SMTP:
        try:
            smtp: smtplib.SMTP = (smtplib.SMTP_SSL if self.ssl else smtplib.SMTP)(
                self.host, self.port, timeout=self.timeout_s)
        except (ConnectionRefusedError, socket.gaierror) as exc:
            raise ProviderUnreachable(f"{self.host}:{self.port}: {exc}") from exc
        except smtplib.SMTPConnectError as exc:  # the relay answered the greeting with a refusal
            raise ProviderUnreachable(f"{self.host}:{self.port}: {exc}") from exc
        try:
            if self.starttls:
                smtp.starttls()
            if self.username and self.password_credential:
                smtp.login(self.username, self.credentials.get(self.password_credential).value)
        except smtplib.SMTPAuthenticationError as exc:
            smtp.close()
            raise ProviderRejected(f"relay refused the login ({exc.smtp_code})") from exc
        except (smtplib.SMTPException, OSError) as exc:
            smtp.close()
            raise ProviderUnreachable(f"relay session could not be set up: {exc}") from exc
        return smtp

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        msg = EmailMessage()
        msg["From"] = args["from"]
        to = args["to"] if isinstance(args["to"], list) else [args["to"]]
        msg["To"] = ", ".join(to)
        if args.get("cc"):
            msg["Cc"] = ", ".join(args["cc"]) if isinstance(args["cc"], list) else args["cc"]
        if args.get("reply_to"):
            msg["Reply-To"] = args["reply_to"]
        msg["Subject"] = args["subject"]
        msg["Date"] = formatdate(localtime=False)
        msg["Message-ID"] = message_id_for(idem_key, self.domain)
        msg.set_content(args["body"])
        smtp = self._connect()
        try:
            refused = smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as exc:  # every recipient refused: nothing was sent
            codes = {code for code, _ in exc.recipients.values()}
            if all(400 <= c < 500 for c in codes):
                raise ProviderUnreachable(f"recipients deferred: {sorted(exc.recipients)}") from exc
            raise ProviderRejected(f"recipients refused: {sorted(exc.recipients)}") from exc
        except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as exc:  # the relay did not accept it
            if 400 <= exc.smtp_code < 500:
                raise ProviderUnreachable(f"relay deferred the message ({exc.smtp_code})") from exc
            raise ProviderRejected(f"relay refused the message ({exc.smtp_code})") from exc
        finally:
            try:
                smtp.quit()
            except (smtplib.SMTPException, OSError):
                smtp.close()
        return {"message_id": msg["Message-ID"], "refused": sorted(refused)}

    def lookup(self, idem_key: str) -> LookupResult:
        assert self._lookup is not None
        return self._lookup(message_id_for(idem_key, self.domain))
