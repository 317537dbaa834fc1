"""The reply-stream tier (controlplane/asgi.py in uvicorn, as ``GUNICORN_SERVER=asgi`` runs it): the same reply
stream as the threaded workers serve, relayed on the event loop, over real HTTP from the protocol stub of the
instance (tests/instance_stub.py). Authentication, the customer-token CORS rules, the throttle and problem+json
come from the same view; many open streams add no thread each.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from asgiref.sync import SyncToAsync
from django.db import connections

from tests.conftest import wait_for
from tests.conversation_helpers import post_json, sse_events, stub_tenant

# The tier's own thread reads what the test wrote: committed rows, not a test transaction's.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tier() -> Iterator[str]:
    from controlplane.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20, what="uvicorn started")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()
    # The tier's one Django thread keeps its database connection: close it, or the test database stays in use.
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture
def chat(operator):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(operator)
    yield tenant, stub
    stub.stop()


@pytest.fixture
def bearer(operator, make_token) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"Authorization": f"Bearer {make_token(operator)}", "Host": "testserver"}


def _messages(tenant) -> str:  # type: ignore[no-untyped-def]
    return f"/api/v1/tenants/{tenant.pk}/threads/support-1/messages"


def _read(url: str, headers: dict[str, str]) -> tuple[httpx.Response, list[tuple[str, str]]]:
    with httpx.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}, timeout=30) as resp:
        return resp, sse_events(resp.read())


def test_the_reply_is_relayed_through_the_tier(api, chat, tier, bearer) -> None:  # type: ignore[no-untyped-def]
    tenant, _stub = chat
    item = post_json(api, _messages(tenant), {"content": "a b c"}).json()["inbox"]["id"]
    resp, events = _read(f"{tier}{_messages(tenant)}/{item}/reply", bearer)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream" and resp.headers["cache-control"] == "no-cache"
    assert [e for e, _ in events] == ["delta", "delta", "delta", "reply", "end"]


def test_a_queued_message_is_delivered_by_the_stream_once_the_instance_is_back(  # type: ignore[no-untyped-def]
        api, chat, tier, bearer) -> None:
    tenant, stub = chat
    stub.down = True
    sent = post_json(api, _messages(tenant), {"content": "hello"})
    assert sent.status_code == 202
    url = f"{tier}{_messages(tenant)}/{sent.json()['inbox']['id']}/reply"
    with httpx.stream("GET", url, headers={**bearer, "Accept": "text/event-stream"}, timeout=30) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: queued"
        stub.down = False  # the stream's next look delivers the message and relays the reply
        rest = "\n".join(lines)
    assert [e for e, _ in sse_events(rest.encode())][-2:] == ["reply", "end"]
    assert len(stub.user_messages("support-1")) == 1


def test_an_upstream_broken_off_ends_with_interrupted(api, chat, tier, bearer) -> None:  # type: ignore[no-untyped-def]
    tenant, stub = chat
    item = post_json(api, _messages(tenant), {"content": "a b c d"}).json()["inbox"]["id"]
    stub.drop_reply_after = 1
    _resp, events = _read(f"{tier}{_messages(tenant)}/{item}/reply", bearer)
    assert [e for e, _ in events] == ["delta", "interrupted"]


def test_an_instance_problem_ends_the_stream_with_error(api, chat, tier, bearer) -> None:  # type: ignore[no-untyped-def]
    tenant, stub = chat
    item = post_json(api, _messages(tenant), {"content": "x"}).json()["inbox"]["id"]
    with stub.lock:  # the instance no longer has the reply: it answers the stream 404 (problem+json)
        stub.threads["support-1"] = [m for m in stub.threads["support-1"] if m["role"] != "assistant"]
    _resp, events = _read(f"{tier}{_messages(tenant)}/{item}/reply", bearer)
    assert [e for e, _ in events] == ["error"], events
    assert '"status":404' in events[0][1].replace(" ", ""), events


def test_refusals_are_problem_json_with_the_cors_header_and_the_throttle_holds(  # type: ignore[no-untyped-def]
        api, chat, tier, bearer, operator, settings) -> None:
    tenant, _stub = chat
    operator.domains = ["shop.example.com"]
    operator.save(update_fields=["domains"])
    item = post_json(api, _messages(tenant), {"content": "x"}).json()["inbox"]["id"]
    url = f"{tier}{_messages(tenant)}/{item}/reply"
    origin = {"Origin": "https://shop.example.com", "Host": "testserver"}
    resp, _ = _read(url, origin)  # no token
    assert resp.status_code == 401 and resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["access-control-allow-origin"] == "https://shop.example.com"
    resp, _ = _read(f"{tier}{_messages(tenant)}/00000000-0000-4000-8000-000000000000/reply", bearer)
    assert resp.status_code == 404 and resp.headers["content-type"] == "application/problem+json"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "operator": "1/min"}}
    statuses = [_read(url, bearer)[0].status_code for _ in range(3)]
    assert statuses[-1] == 429, statuses


def test_many_open_streams_add_no_thread_each(api, chat, tier, bearer) -> None:  # type: ignore[no-untyped-def]
    tenant, stub = chat
    stub.down = True  # every stream waits with `queued` and keep-alives, the way a long reply holds it open
    item = post_json(api, _messages(tenant), {"content": "hello"}).json()["inbox"]["id"]
    url = f"{tier}{_messages(tenant)}/{item}/reply"
    n = 40
    before = threading.active_count()

    async def hold_all() -> int:
        opened, all_open = 0, asyncio.Event()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None)) as client:
            async def one() -> None:
                nonlocal opened
                async with client.stream("GET", url, headers={**bearer, "Accept": "text/event-stream"}) as resp:
                    async for line in resp.aiter_lines():
                        if line == "event: queued":
                            opened += 1
                            if opened == n:
                                all_open.set()
                            await all_open.wait()  # held open until every stream is
                            return

            tasks = [asyncio.create_task(one()) for _ in range(n)]
            await asyncio.wait_for(all_open.wait(), 30)
            during = threading.active_count()
            await asyncio.gather(*tasks)
        return during

    # In a thread of its own: a test before this one in the same process may have left an event loop running in
    # this thread (Playwright's sync API does), and asyncio.run refuses to start inside one.
    with ThreadPoolExecutor(max_workers=1) as pool:
        during = pool.submit(asyncio.run, hold_all()).result()
    # A thread per stream would add n; the tier adds its Django thread and the loop's small connect pool at most.
    assert during - before < 10, (before, during)
