"""The asyncio twin of ``InstanceClient.stream``: one instance event stream read on an event loop, not a thread.

The reply-stream tier (``controlplane.asgi``, docs/production.md "Reply streams") relays thousands of streams
at once; a blocking read per stream would need a thread per stream, which is what that tier exists to avoid.
Same contract as the sync client: the same signature, the same one retry after a 401 (a rotated token), the same
errors (``InstanceUnavailable`` / ``InstanceProblem`` before the first byte, ``StreamInterrupted`` after it) and
the same read timeout (the instance sends a keep-alive every 10 s). HTTP/1.1 framing is h11's.

Only the short blocking parts leave the loop: the signing key and location (database, vault; cached per tenant)
and the connect (a local instance may listen in its own network namespace).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import h11
from asgiref.sync import sync_to_async

from tenants.models import Tenant

from .client import (
    STREAM_READ_TIMEOUT_S,
    InstanceUnavailable,
    StreamInterrupted,
    _connect,
    _problem_of,
    _target,
    forget_tenant,
)
from .signing import sign

__all__ = ["instance_stream"]

_READ_BYTES = 64 * 1024
_PROBLEM_MAX_BYTES = 64 * 1024


class _Upstream:
    """One HTTP exchange with the instance over asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.http = h11.Connection(h11.CLIENT)

    async def send(self, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        data = self.http.send(h11.Request(method=method, target=target, headers=headers))
        data = (data or b"") + (self.http.send(h11.EndOfMessage()) or b"")
        self.writer.write(data)
        await self.writer.drain()

    async def next_event(self) -> object:
        """The next h11 event; OSError / TimeoutError / h11.RemoteProtocolError when the peer fails."""
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            chunk = await asyncio.wait_for(self.reader.read(_READ_BYTES), STREAM_READ_TIMEOUT_S)
            self.http.receive_data(chunk)

    async def body(self, limit: int) -> bytes:
        raw = bytearray()
        while len(raw) < limit:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                raw += event.data
            else:
                break
        return bytes(raw[:limit])

    def close(self) -> None:
        self.writer.close()


async def _open(tenant: Tenant, path: str) -> _Upstream:
    for attempt in (1, 2):
        target = await sync_to_async(_target)(tenant)  # the database and vault: Django's thread
        sock, host, port, prefix = await sync_to_async(_connect, thread_sensitive=False)(target)
        full_path = prefix + path
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            raise InstanceUnavailable() from None
        upstream = _Upstream(reader, writer)
        try:
            await upstream.send("GET", full_path, [
                ("Host", f"{host}:{port}" if port else host), ("Accept", "text/event-stream"),
                ("Authorization", sign(target.key, target.tenant_id, "GET", full_path, b""))])
            response = await upstream.next_event()
            if not isinstance(response, h11.Response):
                raise h11.RemoteProtocolError("no response")
            if response.status_code == 200:
                return upstream
            raw = await upstream.body(_PROBLEM_MAX_BYTES)
        except (OSError, TimeoutError, h11.ProtocolError):
            upstream.close()
            raise InstanceUnavailable() from None
        upstream.close()
        if response.status_code == 401:
            if attempt == 1:  # perhaps a rotated token: derive the key again, once
                forget_tenant(target.tenant_id)
                continue
            raise InstanceUnavailable("the agent instance refused the control plane's signature")
        raise _problem_of(response.status_code, raw)
    raise AssertionError("unreachable")


async def instance_stream(tenant: Tenant, path: str) -> AsyncIterator[bytes]:
    """The upstream SSE bytes of ``path`` as they arrive: awaiting this opens the stream and raises
    InstanceUnavailable / InstanceProblem; iterating raises StreamInterrupted if it breaks off."""
    upstream = await _open(tenant, path)
    return _chunks(upstream)


async def _chunks(upstream: _Upstream) -> AsyncIterator[bytes]:
    try:
        while True:
            try:
                event = await upstream.next_event()
            except (OSError, TimeoutError, h11.ProtocolError) as exc:
                raise StreamInterrupted(type(exc).__name__) from None
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return
    finally:
        upstream.close()
