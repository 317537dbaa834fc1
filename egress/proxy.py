"""The egress proxy itself: asyncio streams, one tenant's policy, no Django.

Speaks what HTTPS_PROXY/HTTP_PROXY clients (urllib, requests, httpx, curl) send: ``CONNECT host:port`` (a byte
tunnel: TLS stays end to end, nothing is intercepted) and plain-http absolute-form requests (``GET http://h/p``),
forwarded once with ``Connection: close``. For each, in this order: the request head must arrive within
``header_timeout_s`` and fit ``max_header_bytes``; ``policy.permits(host, port)`` (the allow-list) must say yes;
the host is resolved once and every address must be public (``controlplane.addresses``, unless
``allow_private_addresses``); the connection goes to the first checked address, never to a second lookup (no
DNS rebinding between check and connect). Bounded: at most ``max_connections`` at once (the next one gets a 503),
``connect_timeout_s`` to reach the peer, ``idle_timeout_s`` without a byte read either way cuts the connection,
``max_duration_s`` caps it, and a chunk is written and drained before the next is read (no unbounded buffer).

Every request that named a destination ends in exactly one ``policy.record(Decision)``: host, port, outcome,
bytes each way, duration; never the path, query, headers or body.

Two ways to know whose policy applies: one tenant per proxy (``start_proxy(listen, policy)``), or one proxy for the
machine (``start_proxy(listen, tenants=...)``) where each request names its tenant with standard proxy
authentication (RFC 9110 11.7.1, ``Proxy-Authorization: Basic <tenant id>:<instance token>``: what every client
sends for ``HTTPS_PROXY=http://user:secret@host:port``). A missing or wrong credential is a 407 before anything
else, logged with the claimed user only; the credential is never forwarded (hop-by-hop here) nor logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from controlplane.addresses import is_public_address

from .choices import DecisionReason, RequestKind
from .rules import host_normalize

__all__ = ["Decision", "EgressPolicy", "EgressTenants", "ProxyLimits", "proxy_credentials", "start_proxy"]

logger = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_TENANT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never forwarded. Proxy-Authorization is a credential
# meant for us, not for the origin.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
                         b"proxy-authenticate", b"te", b"trailer", b"upgrade"})


@dataclass(frozen=True)
class ProxyLimits:
    max_connections: int = 64  # per tenant
    max_connections_total: int = 1024  # the machine's proxy, all tenants together
    header_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    max_duration_s: float = 3600.0
    max_header_bytes: int = 16 * 1024
    allow_private_addresses: bool = False  # development and tests only: see EGRESS_ALLOW_PRIVATE_ADDRESSES


@dataclass(frozen=True)
class Decision:
    """What the log keeps of one request: nothing a client sent beyond the destination's host and port."""

    allowed: bool
    reason: DecisionReason
    kind: RequestKind
    host: str
    port: int
    bytes_up: int = 0  # client -> peer
    bytes_down: int = 0  # peer -> client
    duration_ms: int = 0


class EgressPolicy(Protocol):
    """One tenant's view: its allow-list and its log (``egress.runner.TenantEgressPolicy`` reads PostgreSQL)."""

    async def permits(self, host: str, port: int) -> bool: ...

    async def record(self, decision: Decision) -> None: ...


class EgressTenants(Protocol):
    """The machine-wide proxy's view of every tenant: whose policy a credential opens (``egress.runner``
    verifies instance tokens)."""

    async def policy_for(self, user: str, secret: str) -> EgressPolicy | None: ...


def proxy_credentials(header_lines: list[bytes]) -> tuple[str, str] | None:
    """(user, secret) from the request's ``Proxy-Authorization: Basic`` header; None when absent or malformed
    (or sent twice: which one would count is ambiguous)."""
    found = [line.partition(b":")[2].strip() for line in header_lines
             if line.partition(b":")[0].strip().lower() == b"proxy-authorization"]
    if len(found) != 1:
        return None
    scheme, _, token = found[0].partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        user, sep, secret = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeError):
        return None
    return (user, secret) if sep and user and secret else None


class _Refused(Exception):
    def __init__(self, status: int, reason: DecisionReason, text: str) -> None:
        super().__init__(text)
        self.status, self.reason, self.text = status, reason, text


@dataclass
class _Transfer:
    up: int = 0
    down: int = 0
    last: float = field(default_factory=time.monotonic)


_STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
                431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable",
                504: "Gateway Timeout"}


async def _answer(writer: asyncio.StreamWriter, status: int, text: str, reason: str = "") -> None:
    body = (text + "\n").encode()
    head = (f"HTTP/1.1 {status} {_STATUS_TEXT[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            + ('Proxy-Authenticate: Basic realm="egress"\r\n' if status == 407 else "")
            + (f"X-Egress-Refused: {reason}\r\n" if reason else "") + "\r\n")
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(head.encode() + body)
        await asyncio.wait_for(writer.drain(), 5.0)


def _authority(text: str) -> tuple[str, int]:
    """``host:port`` of a CONNECT (``[v6]:port`` too); ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("CONNECT needs host:port")
    return host_normalize(host), int(port)


def _forwarded_head(method: bytes, path: str, host_header: str, header_lines: list[bytes]) -> bytes:
    """The origin-form request for the peer: hop-by-hop headers (and those ``Connection`` names) dropped, Host kept
    or set, ``Connection: close`` so the peer ends the exchange and the proxy can close."""
    named: set[bytes] = set()
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"connection":
            named |= {token.strip().lower() for token in value.split(b",")}
    kept, has_host = [], False
    for line in header_lines:
        name = line.partition(b":")[0].strip().lower()
        if name in _HOP_BY_HOP or name in named:
            continue
        has_host |= name == b"host"
        kept.append(line)
    if not has_host:
        kept.insert(0, b"Host: " + host_header.encode("ascii"))
    return b"\r\n".join([method + b" " + path.encode("ascii") + b" HTTP/1.1", *kept, b"Connection: close", b"", b""])


class _Proxy:
    def __init__(self, policy: EgressPolicy | None, limits: ProxyLimits, tenants: EgressTenants | None) -> None:
        self.policy, self.limits, self.tenants = policy, limits, tenants
        self.active = 0
        # The machine's proxy: ``max_connections`` per tenant (one tenant cannot take every slot), and
        # ``max_connections_total`` for all of them.
        self.active_per_policy: dict[int, int] = {}
        self.capacity = limits.max_connections if tenants is None else limits.max_connections_total

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.capacity:
            await _answer(writer, 503, "egress proxy: too many connections")
            writer.close()
            return
        self.active += 1
        try:
            await self._serve(reader, writer)
        finally:
            self.active -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = time.monotonic()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.header_timeout_s)
        except (asyncio.LimitOverrunError, ValueError):
            await _answer(writer, 431, "egress proxy: request head too large")
            return
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            return  # a client that never finished its request named no destination: nothing to log
        lines = head[:-4].split(b"\r\n")
        policy = self.policy if self.tenants is None else await self._authenticated(lines[1:])
        if policy is None:
            await _answer(writer, 407, "egress proxy: proxy authentication required", "proxy_auth")
            return
        if self.tenants is None:
            await self._serve_request(policy, reader, writer, lines, started)
            return
        if self.active_per_policy.get(id(policy), 0) >= self.limits.max_connections:
            await _answer(writer, 503, "egress proxy: too many connections")
            return
        self.active_per_policy[id(policy)] = self.active_per_policy.get(id(policy), 0) + 1
        try:
            await self._serve_request(policy, reader, writer, lines, started)
        finally:
            self.active_per_policy[id(policy)] -= 1
            if not self.active_per_policy[id(policy)]:
                del self.active_per_policy[id(policy)]

    async def _serve_request(self, policy: EgressPolicy, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter, lines: list[bytes], started: float) -> None:
        kind, host, port = RequestKind.HTTP, "", 0
        try:
            method, target, _version = lines[0].decode("ascii").split(" ")
            if method == "CONNECT":
                kind = RequestKind.CONNECT
                host, port = _authority(target)
                path = ""
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname or parts.username or parts.password:
                    raise ValueError("absolute http:// URL without credentials expected (https goes through CONNECT)")
                host, port = host_normalize(parts.hostname), parts.port or 80
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        except (ValueError, UnicodeError):
            await self._refuse(policy, writer, _Refused(400, DecisionReason.BAD_REQUEST, "egress proxy: bad request"),
                               kind, host, port, started)
            return
        try:
            address = await self._checked_address(policy, host, port)
            upstream_reader, upstream_writer = await self._connect(address, port)
        except _Refused as refused:
            await self._refuse(policy, writer, refused, kind, host, port, started)
            return
        transfer = _Transfer()
        try:
            if kind == RequestKind.CONNECT:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                netloc = host if port == 80 else f"{host}:{port}"
                upstream_writer.write(_forwarded_head(method.encode(), path, netloc, lines[1:]))
            await self._relay(reader, writer, upstream_reader, upstream_writer, transfer)
        finally:
            upstream_writer.close()
            await policy.record(Decision(True, DecisionReason.ALLOWED, kind, host, port, transfer.up,
                                              transfer.down, _ms_since(started)))

    async def _authenticated(self, header_lines: list[bytes]) -> EgressPolicy | None:
        """The policy of the tenant the request's credential proves, or None (logged with the claimed user only:
        the secret never reaches a log line, and a user name is at most a tenant id long)."""
        assert self.tenants is not None
        credentials = proxy_credentials(header_lines)
        if credentials is None:
            logger.warning("egress proxy request without a valid Proxy-Authorization",
                           extra={"event": "egress_proxy_auth_missing"})
            return None
        try:
            policy = await self.tenants.policy_for(*credentials)
        except Exception:  # fail closed: a credential that cannot be checked opens nothing
            logger.exception("egress proxy credential check failed")
            return None
        if policy is None:
            # The user is logged only when it is shaped like a tenant id: a client that put its secret there
            # (a misconfigured URL) must not see it land in the log.
            user = credentials[0] if _TENANT_ID.match(credentials[0]) else "(not a tenant id)"
            logger.warning("egress proxy credential refused", extra={"event": "egress_proxy_auth_refused",
                                                                     "user": user})
        return policy

    async def _refuse(self, policy: EgressPolicy, writer: asyncio.StreamWriter, refused: _Refused, kind: RequestKind,
                      host: str, port: int, started: float) -> None:
        await _answer(writer, refused.status, refused.text, refused.reason.value)
        await policy.record(Decision(False, refused.reason, kind, host[:253], port,
                                          duration_ms=_ms_since(started)))

    async def _checked_address(self, policy: EgressPolicy, host: str, port: int) -> str:
        """The address to connect to: the host must be allowed, resolve, and resolve to public addresses only."""
        try:
            permitted = await policy.permits(host, port)
        except Exception:  # fail closed: an allow-list that cannot be read allows nothing
            logger.exception("egress allow-list unavailable")
            raise _Refused(503, DecisionReason.POLICY_UNAVAILABLE, "egress proxy: allow-list unavailable") from None
        if not permitted:
            raise _Refused(403, DecisionReason.NOT_LISTED, f"egress refused: {host}:{port} is not on the allow-list")
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
                self.limits.connect_timeout_s)
        except (TimeoutError, OSError, UnicodeError):
            raise _Refused(502, DecisionReason.UNRESOLVABLE, f"egress proxy: {host} does not resolve") from None
        addresses = sorted({str(info[4][0]) for info in infos})
        if not addresses:
            raise _Refused(502, DecisionReason.UNRESOLVABLE, f"egress proxy: {host} does not resolve")
        if not self.limits.allow_private_addresses and not all(is_public_address(a) for a in addresses):
            raise _Refused(403, DecisionReason.PRIVATE_ADDRESS,
                           f"egress refused: {host} resolves to a private, loopback or reserved address")
        return addresses[0]

    async def _connect(self, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port, limit=_CHUNK),
                                          self.limits.connect_timeout_s)
        except TimeoutError:
            raise _Refused(504, DecisionReason.UPSTREAM_TIMEOUT, "egress proxy: the peer did not answer") from None
        except OSError:
            raise _Refused(502, DecisionReason.UPSTREAM_UNREACHABLE, "egress proxy: the peer refused") from None

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                     upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter,
                     transfer: _Transfer) -> None:
        """Copy both ways until the peer is done (its EOF ends the exchange), an error, ``idle_timeout_s`` without a
        byte read either way, or ``max_duration_s``. A client's EOF is passed on as a half-close."""
        up = asyncio.create_task(self._copy(client_reader, upstream_writer, transfer, upward=True))
        down = asyncio.create_task(self._copy(upstream_reader, client_writer, transfer, upward=False))
        deadline = time.monotonic() + self.limits.max_duration_s
        try:
            while not down.done():
                now = time.monotonic()
                if now - transfer.last > self.limits.idle_timeout_s or now > deadline:
                    return
                if up.done() and up.result() is False:  # the client's side failed: nothing more to deliver
                    return
                wait = min(self.limits.idle_timeout_s - (now - transfer.last), deadline - now, 1.0)
                await asyncio.wait({down, up} if not up.done() else {down}, timeout=max(wait, 0.01),
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transfer: _Transfer, *,
                    upward: bool) -> bool:
        """True at a clean EOF (passed on as a half-close), False when either side failed."""
        try:
            while data := await reader.read(_CHUNK):
                transfer.last = time.monotonic()
                if upward:
                    transfer.up += len(data)
                else:
                    transfer.down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            return True
        except (ConnectionError, OSError):
            return False


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


async def start_proxy(listen: str | tuple[str, int] | socket.socket, policy: EgressPolicy | None = None,
                      limits: ProxyLimits | None = None, *, tenants: EgressTenants | None = None) -> asyncio.Server:
    """Serve ``policy``'s tenant, or every tenant of ``tenants`` by its proxy credential (exactly one of the two), on
    ``listen``: a unix socket path (``str``), a TCP ``(host, port)``, or a socket already bound (and listening or
    not) by whoever built the sandbox's path out. Returns the started server; close it to stop. The stream limit is
    the header limit: a longer head is a 431, never buffered."""
    if (policy is None) == (tenants is None):
        raise ValueError("one tenant's policy or the tenants, not both or neither")
    limits = limits or ProxyLimits()
    handler = _Proxy(policy, limits, tenants).handle
    if isinstance(listen, socket.socket):
        if listen.family == socket.AF_UNIX:
            return await asyncio.start_unix_server(handler, sock=listen, limit=limits.max_header_bytes)
        return await asyncio.start_server(handler, sock=listen, limit=limits.max_header_bytes)
    if isinstance(listen, str):
        return await asyncio.start_unix_server(handler, path=listen, limit=limits.max_header_bytes)
    host, port = listen
    return await asyncio.start_server(handler, host, port, limit=limits.max_header_bytes)
