"""The instance client's pool of kept-alive connections, over the wire to the protocol stub (an HTTP/1.1 server of
the test's own): calls share a connection; an HTTP/1.0 answer is never kept; the pool keeps a few per tenant; a
forked child starts with an empty pool and leaves the parent's connections working."""

from __future__ import annotations

import http.client
import os

import pytest

from instances import client
from instances.client import InstanceClient
from tests.conversation_helpers import stub_tenant

pytestmark = pytest.mark.django_db


def _ports(tenant) -> list[int]:  # type: ignore[no-untyped-def]
    return [k.conn.sock.getsockname()[1] for k in client._pool._idle.get(str(tenant.pk), []) if k.conn.sock]


def _get(tenant) -> None:  # type: ignore[no-untyped-def]
    status, _ = InstanceClient(tenant).request_json("GET", "/v1/tasks")
    assert status == 200


def test_calls_share_one_connection(operator):
    tenant, stub = stub_tenant(operator)
    try:
        _get(tenant)
        first = _ports(tenant)
        for _ in range(3):
            _get(tenant)
        assert len(first) == 1 and _ports(tenant) == first
    finally:
        stub.stop()
    assert _ports(tenant) == [], "stopping the stub forgets the tenant's connections"


def test_an_http_1_0_answer_is_never_kept(operator):
    tenant, stub = stub_tenant(operator)
    stub.server.RequestHandlerClass.protocol_version = "HTTP/1.0"  # an instance from before keep-alive
    try:
        _get(tenant)
        _get(tenant)
        assert _ports(tenant) == []
    finally:
        stub.stop()


def test_the_pool_keeps_a_few_idle_connections_per_tenant(operator, monkeypatch):
    tenant, stub = stub_tenant(operator)
    monkeypatch.setattr(client, "KEEPALIVE_PER_TENANT", 2)
    try:
        taken = [client._pool.take(str(tenant.pk), "local") for _ in range(3)]
        assert taken == [None, None, None]
        kept = []
        for _ in range(3):  # three connections in use at once, as three threads would hold them
            sock, host, port, prefix = client._connect(client._target(tenant))
            conn = http.client.HTTPConnection(host, port)
            conn.sock = sock
            kept.append(client._Kept(conn, client._where(client._target(tenant)), prefix, 0.0))
        for k in kept:
            client._pool.give_back(str(tenant.pk), k)
        assert len(client._pool._idle[str(tenant.pk)]) == 2
        assert kept[2].conn.sock is None, "the third was closed, not kept"
    finally:
        stub.stop()


def test_a_forked_child_starts_with_no_connections_and_the_parents_keep_working(operator):
    tenant, stub = stub_tenant(operator)
    try:
        _get(tenant)
        before = _ports(tenant)
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's to use
            os._exit(0 if client._pool._idle == {} else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        _get(tenant)
        assert _ports(tenant) == before, "the parent's connection is still open and used"
    finally:
        stub.stop()
