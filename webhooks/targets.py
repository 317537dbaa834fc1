"""Where a webhook may go, and the one HTTP request that takes it there.

SSRF: an endpoint URL is the operator's input, and the control plane sits next to databases, the broker and
cluster services. So an URL must be https (``WEBHOOK_ALLOW_HTTP`` opens plain http, for development and
tests), and every address its host resolves to must be public: loopback, private, link-local (cloud
metadata), multicast and reserved ranges are refused unless ``WEBHOOK_ALLOW_PRIVATE_ADDRESSES`` is set
(development and tests only). The check runs again at every attempt, and the request connects to the
address that was checked (no second lookup a rebinding DNS server could answer differently). Redirects
are not followed. No database access here.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from controlplane.addresses import is_public_address
from controlplane.errors import ValidationFailed

__all__ = ["Target", "target_check", "post_signed", "PostOutcome"]

USER_AGENT = "agent-control-plane-webhooks/1"
_EXCERPT_BYTES = 500
# Response headers the delivery log keeps: the ones that explain an answer. Anything else (Set-Cookie, an auth
# challenge, a token a receiver echoes, a proxy's internal names) is dropped unread: an allow-list, because a
# deny-list misses the header nobody thought of.
KEPT_RESPONSE_HEADERS = ("content-type", "content-length", "content-encoding", "date", "retry-after", "server",
                         "x-request-id", "request-id", "x-correlation-id", "cf-ray", "via")
_HEADER_VALUE_CHARS = 200


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked IP the request connects to


@dataclass(frozen=True)
class PostOutcome:
    status_code: int | None
    error: str
    duration_ms: int
    response_excerpt: str
    response_body: str = ""  # the first ``WEBHOOK_LOG_RESPONSE_BYTES`` of the answer, decoded
    response_truncated: bool = False  # the answer was longer than that
    response_headers: dict[str, str] | None = None  # only ``KEPT_RESPONSE_HEADERS``

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def target_check(url: str, *, resolve: bool = True) -> Target:
    """The URL's parts and a checked address; ValidationFailed says why an URL may not be used."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. "https://[0]/": a bracketed host that is no IPv6 address (was a 500)
        raise ValidationFailed("url is not a valid URL") from None
    allowed = ("https", "http") if settings.WEBHOOK_ALLOW_HTTP else ("https",)
    if parts.scheme not in allowed:
        raise ValidationFailed("url must use https" if parts.scheme != "https" else "url is not allowed")
    if not parts.hostname:
        raise ValidationFailed("url must name a host")
    if parts.username or parts.password:
        raise ValidationFailed("url must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValidationFailed("url has an invalid port") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not resolve:
        return Target(parts.scheme, parts.hostname, port, path, "")
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ValidationFailed(f"url host {parts.hostname} does not resolve") from None
    addresses = sorted({str(info[4][0]) for info in infos})
    if not settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
        refused = [a for a in addresses if not is_public_address(a)]
        if refused:
            raise ValidationFailed(f"url host {parts.hostname} resolves to a private or reserved address; "
                                   "webhooks go to public addresses only")
    return Target(parts.scheme, parts.hostname, port, path, addresses[0])


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to the checked address; the certificate is verified against the URL's host name (SNI too)."""

    def __init__(self, target: Target, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def _text(raw: bytes) -> str:
    """A receiver's bytes as storable text: invalid UTF-8 and NUL (PostgreSQL text refuses it) replaced."""
    return raw.decode("utf-8", "replace").replace("\x00", "\ufffd")


def post_signed(url: str, body: bytes, headers: dict[str, str]) -> PostOutcome:
    """POST ``body`` once; every failure (refused URL, DNS, connect, timeout, non-2xx) is an outcome, not an
    exception. ``error`` names the failure and never holds the request's headers (the signature)."""
    started = time.monotonic()

    def elapsed() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        target = target_check(url)
    except ValidationFailed as exc:
        return PostOutcome(None, f"refused: {exc.detail}", elapsed(), "")
    timeout = settings.WEBHOOK_TIMEOUT_S
    conn_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    conn = conn_class(target, timeout)
    try:
        conn.request("POST", target.path, body=body, headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers})
        response = conn.getresponse()
        limit = max(int(settings.WEBHOOK_LOG_RESPONSE_BYTES), 0)
        # One byte more than kept says whether there was more; the rest is never read (a receiver answering
        # gigabytes costs us the limit, not the answer).
        raw = response.read(max(limit, _EXCERPT_BYTES) + 1)
        kept = {k.lower(): v[:_HEADER_VALUE_CHARS] for k, v in response.getheaders()
                if k.lower() in KEPT_RESPONSE_HEADERS}
        return PostOutcome(response.status, "" if 200 <= response.status < 300 else f"HTTP {response.status}",
                           elapsed(), _text(raw[:_EXCERPT_BYTES]),
                           response_body=_text(raw[:limit]), response_truncated=len(raw) > limit,
                           response_headers=kept)
    except TimeoutError:
        return PostOutcome(None, f"timed out after {timeout:g} s", elapsed(), "")
    except ConnectionRefusedError:
        return PostOutcome(None, "connection refused", elapsed(), "")
    except ssl.SSLError as exc:
        return PostOutcome(None, f"TLS error: {exc.reason or type(exc).__name__}", elapsed(), "")
    except (OSError, http.client.HTTPException) as exc:
        return PostOutcome(None, f"{type(exc).__name__}: {str(exc)[:200]}", elapsed(), "")
    finally:
        conn.close()
