"""The reply stream a client reads: the instance's SSE for one message, proxied byte for byte.

While the message is still in the inbox (the instance is down), the client gets ``event: queued`` and
``: keep-alive`` comments while delivery and the upstream connection are retried every second, up to
``wait_s``; then ``event: timeout`` (the client reconnects). If the upstream breaks off mid-stream (the
instance was killed), the stream ends with ``event: interrupted``: an EventSource reconnects by itself
and the new stream picks up once the instance is back (a reply already committed is sent at once).

Two faces of one loop: ``reply_events`` (a thread per stream, under gunicorn's threaded workers) and
``areply_events`` (on the event loop, under the reply-stream tier ``controlplane.asgi``: thousands of streams
per process, docs/production.md "Reply streams"). Keep them step for step alike.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator

from asgiref.sync import sync_to_async

from instances.async_stream import instance_stream
from instances.client import InstanceProblem, InstanceUnavailable, StreamInterrupted, instance_client
from provisioning.fleet.sleep import instance_waking
from tenants.models import Tenant

from .choices import InboxStatus
from .models import InboxItem
from .services import inbox_deliver

# How often a reply stream looks at its item while the instance wakes (otherwise every ``poll_s``).
WAKING_POLL_S = 0.1

__all__ = ["areply_events", "reply_events", "sse"]

# Events after which the instance closes the stream on purpose.
_FINAL_EVENTS = (b"end", b"timeout")


def sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _final_event_seen(buffer: bytearray) -> tuple[bool, bytearray]:
    """Scan complete lines of ``buffer`` for ``event: end|timeout``; return the unfinished tail."""
    seen = False
    *lines, tail = bytes(buffer).split(b"\n")
    for line in lines:
        line = line.rstrip(b"\r")
        if line.startswith(b"event:") and line[6:].strip() in _FINAL_EVENTS:
            seen = True
    return seen, bytearray(tail)


def reply_events(*, tenant: Tenant, item: InboxItem, wait_s: float = 60.0, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> Iterator[bytes]:
    deadline = clock() + wait_s
    path = f"/v1/threads/{item.thread}/messages/{item.id}/reply"
    announced = False
    while True:
        if item.status == InboxStatus.PENDING:
            inbox_deliver(tenant=tenant)
            item.refresh_from_db()
        if item.status == InboxStatus.REFUSED:
            yield sse("error", item.response or {"status": 400, "detail": "the instance refused this message"})
            return
        if item.status == InboxStatus.DELIVERED:
            try:
                upstream = instance_client(tenant).stream(path)
            except InstanceUnavailable:
                upstream = None
            except InstanceProblem as problem:
                yield sse("error", problem.as_problem())
                return
            if upstream is not None:
                yield from _relay(upstream)
                return
        if not announced:
            yield sse("queued", {"id": str(item.id), "status": item.status})
            announced = True
        if clock() >= deadline:
            yield sse("timeout", {"id": str(item.id)})
            return
        yield b": keep-alive\n\n"
        # Waking from sleep: the item is delivered within moments of the boot, so look again soon.
        sleep(min(poll_s, WAKING_POLL_S) if instance_waking(tenant) else poll_s)


def _relay(upstream: Iterator[bytes]) -> Iterator[bytes]:
    buffer = bytearray()
    finished = False
    try:
        for chunk in upstream:
            yield chunk
            buffer += chunk
            seen, buffer = _final_event_seen(buffer)
            finished = finished or seen
    except StreamInterrupted:
        pass
    finally:
        close = getattr(upstream, "close", None)
        if close is not None:
            close()  # also when our own client went away: the upstream connection must not linger
    if not finished:
        yield sse("interrupted", {"reason": "the agent instance went away; reconnect to resume"})


def _deliver_and_refresh(tenant: Tenant, item: InboxItem) -> None:
    inbox_deliver(tenant=tenant)
    item.refresh_from_db()


async def areply_events(*, tenant: Tenant, item: InboxItem, wait_s: float = 60.0, poll_s: float = 1.0,
                        clock: Callable[[], float] = time.monotonic) -> AsyncIterator[bytes]:
    """``reply_events`` on the event loop: the database work runs in Django's thread (``sync_to_async``), the
    upstream is read with ``instance_stream``, waits are ``asyncio.sleep``."""
    deadline = clock() + wait_s
    path = f"/v1/threads/{item.thread}/messages/{item.id}/reply"
    announced = False
    while True:
        if item.status == InboxStatus.PENDING:
            await sync_to_async(_deliver_and_refresh)(tenant, item)
        if item.status == InboxStatus.REFUSED:
            yield sse("error", item.response or {"status": 400, "detail": "the instance refused this message"})
            return
        if item.status == InboxStatus.DELIVERED:
            try:
                upstream: AsyncIterator[bytes] | None = await instance_stream(tenant, path)
            except InstanceUnavailable:
                upstream = None
            except InstanceProblem as problem:
                yield sse("error", problem.as_problem())
                return
            if upstream is not None:
                async for chunk in _arelay(upstream):
                    yield chunk
                return
        if not announced:
            yield sse("queued", {"id": str(item.id), "status": item.status})
            announced = True
        if clock() >= deadline:
            yield sse("timeout", {"id": str(item.id)})
            return
        yield b": keep-alive\n\n"
        waking = await sync_to_async(instance_waking)(tenant)
        await asyncio.sleep(min(poll_s, WAKING_POLL_S) if waking else poll_s)


async def _arelay(upstream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    buffer = bytearray()
    finished = False
    try:
        async for chunk in upstream:
            yield chunk
            buffer += chunk
            seen, buffer = _final_event_seen(buffer)
            finished = finished or seen
    except StreamInterrupted:
        pass
    finally:
        aclose = getattr(upstream, "aclose", None)
        if aclose is not None:
            await aclose()  # also when our own client went away: the upstream connection must not linger
    if not finished:
        yield sse("interrupted", {"reason": "the agent instance went away; reconnect to resume"})
