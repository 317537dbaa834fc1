"""Was this email sent? A search by Message-ID in an IMAP folder: the sender's "Sent" folder or an archive.

`ImapLookup` is the `lookup` an `SmtpEffect` can be given. Called with a Message-ID, it logs in with the stdlib
`imaplib` (imap://, imaps://, or imap:// upgraded with `?starttls=1`), opens the folder read-only (EXAMINE),
searches `HEADER Message-ID` and checks the header of each hit: FOUND names the message (mailbox and UID),
ABSENT means the folder answered and holds no such message; anything else (connection refused, TLS, login
refused, a missing folder, a timeout, a server that answers NO) is UNKNOWN, never ABSENT, so an email in doubt
stays in doubt rather than being sent twice.

It holds the URL's parts and the *name* of the credential holding the password; the password itself is read
from the credential source at each lookup, used for LOGIN and dropped: it is never stored, logged, or part of
an answer or an exception message. It does not write to the mailbox (no flags, no APPEND: filing the copy is
the relay's or the mail client's job), keeps no connection between lookups, and does not decide how long
ABSENT is mistrusted after a send (the archive may lag): that is the effect's `lookup_consistency_s`, which
the ledger applies.
"""

from __future__ import annotations

import email.parser
import email.policy
import imaplib
import re
import ssl
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from agent_runtime.effects.base import LookupResult
from agent_runtime.errors import CredentialUnavailable
from agent_runtime.host.credentials import CredentialSource

__all__ = ["DEFAULT_MAILBOX", "ImapLookup"]

DEFAULT_MAILBOX = "Sent"

# What `message_id_for` makes, and all a quoted IMAP search string can carry without escapes or literals.
_MESSAGE_ID = re.compile(r"<[\x21-\x7e]+>")
_UID = re.compile(rb"\bUID (\d+)")


def _quoted(value: str) -> str:
    """An IMAP quoted string (RFC 3501 section 4.3); only ASCII without CR/LF is accepted by the callers."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _imap_text(value: str, what: str) -> str:
    if not value.isascii() or "\r" in value or "\n" in value or "\x00" in value:
        raise ValueError(f"IMAP {what} must be ASCII without line breaks")
    return value


class ImapLookup:
    """`lookup(message_id) -> LookupResult` against `url`: imap[s]://user:credential-name@host[:port][/MAILBOX]
    [?starttls=1]; the mailbox defaults to "Sent"; `credentials.get(credential-name).value` is the password."""

    def __init__(self, url: str, *, credentials: CredentialSource, timeout_s: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("imap", "imaps"):
            raise ValueError(f"IMAP URL must be imap:// or imaps://, not {parsed.scheme!r}")
        if not parsed.hostname:
            raise ValueError("IMAP URL has no host")
        if not parsed.username or not parsed.password:
            raise ValueError("IMAP URL must name the user and the credential holding the password: "
                             "imap[s]://user:credential-name@host/MAILBOX")
        query = parse_qs(parsed.query, keep_blank_values=True)
        if set(query) - {"starttls"} or query.get("starttls", ["1"]) != ["1"]:
            raise ValueError(f"IMAP URL: the only option is ?starttls=1, not {parsed.query!r}")
        self.tls = parsed.scheme == "imaps"
        self.starttls = "starttls" in query
        if self.tls and self.starttls:
            raise ValueError("IMAP URL: imaps:// is TLS from the start; ?starttls=1 is for imap://")
        self.host = parsed.hostname
        self.port = parsed.port or (993 if self.tls else 143)
        self.username = _imap_text(unquote(parsed.username), "user names")
        self.password_credential = unquote(parsed.password)
        self.mailbox = _imap_text(unquote(parsed.path.removeprefix("/")) or DEFAULT_MAILBOX, "mailbox names")
        self.credentials = credentials
        self.timeout_s = float(timeout_s)
        # Certificates are verified (the stdlib's own default for imaplib is not to): a server that cannot
        # prove its name could answer "absent" and have an email sent twice.
        self.ssl_context = ssl_context if ssl_context is not None else ssl.create_default_context()

    def __repr__(self) -> str:
        scheme = "imaps" if self.tls else "imap"
        return f"ImapLookup({scheme}://{self.username}@{self.host}:{self.port}/{self.mailbox})"

    @property
    def _where(self) -> str:
        return f"IMAP {self.host}:{self.port} mailbox {self.mailbox!r}"

    def __call__(self, message_id: str) -> LookupResult:
        if not _MESSAGE_ID.fullmatch(message_id) or '"' in message_id or "\\" in message_id:
            raise ValueError(f"not a Message-ID this lookup can search for: {message_id!r}")
        try:
            password = self.credentials.get(self.password_credential).value
        except CredentialUnavailable as exc:
            return LookupResult.unknown(f"{self._where}: {exc}")
        try:
            return self._search(message_id, password)
        except UnicodeError:  # imaplib sends ASCII only; the error would quote a character of the password
            return LookupResult.unknown(f"{self._where}: the password is not ASCII (IMAP LOGIN cannot send it)")
        except (imaplib.IMAP4.error, OSError, EOFError) as exc:  # refused, reset, timeout, TLS, NO/BAD answers
            detail = f"{self._where}: {type(exc).__name__}: {exc}"
            return LookupResult.unknown(detail.replace(password, "***") if password else detail)

    def _connect(self) -> imaplib.IMAP4:
        if self.tls:
            return imaplib.IMAP4_SSL(self.host, self.port, ssl_context=self.ssl_context, timeout=self.timeout_s)
        conn = imaplib.IMAP4(self.host, self.port, timeout=self.timeout_s)
        if self.starttls:
            try:
                conn.starttls(ssl_context=self.ssl_context)
            except BaseException:
                _close(conn)
                raise
        return conn

    def _search(self, message_id: str, password: str) -> LookupResult:
        conn = self._connect()
        try:
            conn.login(_quoted(self.username), password)
            typ, data = conn.select(_quoted(self.mailbox), readonly=True)
            if typ != "OK":
                return LookupResult.unknown(f"{self._where} cannot be opened: {_text(data)}")
            typ, data = conn.uid("SEARCH", "HEADER", "Message-ID", _quoted(message_id))
            if typ != "OK":
                return LookupResult.unknown(f"{self._where}: SEARCH answered {typ}: {_text(data)}")
            uids = [u.decode() for u in (data[0] or b"").split()] if data else []
            if not uids:
                return LookupResult.absent()
            # SEARCH HEADER is a substring match, and servers with full-text search match more loosely still:
            # only a message whose Message-ID is exactly this one counts as the email having been sent.
            typ, data = conn.uid("FETCH", ",".join(uids), "(UID BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
            if typ != "OK":
                return LookupResult.unknown(f"{self._where}: FETCH answered {typ}: {_text(data)}")
            for uid, found_id in _message_ids(data):
                if found_id == message_id:
                    return LookupResult.found({"message_id": message_id, "mailbox": self.mailbox, "uid": uid})
            return LookupResult.unknown(f"{self._where}: SEARCH matched UIDs {uids} but none has exactly "
                                        f"Message-ID {message_id}")
        finally:
            try:
                conn.logout()
            except (imaplib.IMAP4.error, OSError, EOFError):
                _close(conn)


def _close(conn: imaplib.IMAP4) -> None:
    """Close a connection whose session is already broken (a failed handshake may have closed the socket)."""
    try:
        conn.shutdown()
    except OSError:
        pass


def _message_ids(data: list[Any]) -> list[tuple[int, str]]:
    """(UID, Message-ID) of each message in a FETCH answer; a folded header is unfolded."""
    parser = email.parser.BytesHeaderParser(policy=email.policy.default)
    out = []
    for item in data:
        if not isinstance(item, tuple) or len(item) < 2:
            continue
        uid = _UID.search(item[0])
        if uid is None:
            continue
        value = parser.parsebytes(item[1]).get("Message-ID")
        out.append((int(uid.group(1)), "".join(str(value or "").split())))
    return out


def _text(data: list[Any]) -> str:
    return " ".join(d.decode(errors="replace") if isinstance(d, bytes) else str(d) for d in data or [])[:300]
