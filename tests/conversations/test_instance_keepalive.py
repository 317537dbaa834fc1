"""The control plane keeps its connection to an instance alive between calls (issue 39: a message's call no longer
connects, nor the instance starts a thread for it). Against a real agent-host: the second message goes out on the
first one's connection (the same local port); a restarted instance's old connection is never used and costs no
error; one the instance closed when idle is dropped before use; and a request the instance cannot read to its end
closes its connection rather than leaving bytes for the next one."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest

from instances import client
from provisioning.drivers.local_process import live_host_pid
from provisioning.fleet.instances import instance_start
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import kill_session_instances
from tests.conversation_helpers import chat_hold, chat_release, post_json
from tests.conversations.test_conversations_e2e import EXTRA_ENV, _messages, _onboard, _port, _stop

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 1.5  # the instances' keep-alive here: short enough to wait out


@pytest.fixture
def fleet(worker_factory, settings):  # type: ignore[no-untyped-def]
    extra = {**EXTRA_ENV, "AGENT_HTTP_KEEPALIVE_S": str(IDLE_S)}
    settings.INSTANCE_EXTRA_ENV = extra  # this process restarts instances too (instance_start)
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    chat_release()
    yield worker
    kill_session_instances()


def _kept_ports(tenant: Tenant) -> list[int]:
    """The local ports of the tenant's idle kept-alive connections (a new connection gets a new one)."""
    return [k.conn.sock.getsockname()[1] for k in client._pool._idle.get(str(tenant.pk), []) if k.conn.sock]


def _send(api, tenant: Tenant, text: str) -> None:  # type: ignore[no-untyped-def]
    sent = post_json(api, _messages(tenant), {"content": text})
    assert sent.status_code == 201, sent.content
    assert sent.json()["inbox"]["status"] == "delivered"


def test_messages_share_one_connection_and_a_restarted_instance_costs_no_error(api, fleet):
    tenant = _onboard(api.operator, "keep-a", fleet)
    _send(api, tenant, "first")
    first = _kept_ports(tenant)
    assert len(first) == 1, "the answer's connection is kept"
    _send(api, tenant, "second")
    assert _kept_ports(tenant) == first, "the second message went out on the first one's connection"

    _stop(tenant)  # its connections die with it
    instance_start(tenant=tenant, actor=SYSTEM)
    _send(api, tenant, "after the restart")  # not a 202 and not a 503: the dead connection was never used
    after = _kept_ports(tenant)
    assert len(after) == 1 and after != first


def test_a_connection_the_instance_closed_when_idle_is_dropped_before_use(api, fleet):
    tenant = _onboard(api.operator, "keep-b", fleet)
    _send(api, tenant, "first")
    (kept,) = client._pool._idle[str(tenant.pk)]
    old_port = kept.conn.sock.getsockname()[1]
    time.sleep(IDLE_S + 1.0)
    assert not client._quiet(kept.conn), "the instance closed the idle connection"
    _send(api, tenant, "after the idle limit")
    now = _kept_ports(tenant)
    assert len(now) == 1 and now != [old_port], "a new connection, kept in its turn"


def test_a_body_the_instance_does_not_read_closes_its_connection(api, fleet):
    tenant = _onboard(api.operator, "keep-c", fleet)
    conn = http.client.HTTPConnection("127.0.0.1", _port(tenant), timeout=5)
    conn.request("POST", "/healthz", body=json.dumps({"unread": "x" * 100}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 404 and resp.will_close, "its unread body would be read as the next request"
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", _port(tenant), timeout=5)
    conn.request("GET", "/readyz")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200 and not resp.will_close, "an answer read to its end keeps its connection"
    conn.request("GET", "/readyz")  # the same connection, a second request
    assert conn.getresponse().status == 200
    conn.close()


def test_a_stopping_instance_answers_a_kept_connections_next_request_503_and_closes_it(api, fleet):
    tenant = _onboard(api.operator, "keep-d", fleet)
    chat_hold()  # a run holds inside its step: the stop waits for it, the host stays up meanwhile
    try:
        sent = post_json(api, _messages(tenant), {"content": "hold on"})
        assert sent.status_code == 201, sent.content
        conn = http.client.HTTPConnection("127.0.0.1", _port(tenant), timeout=5)
        conn.request("GET", "/readyz")
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and not first.will_close
        os.kill(live_host_pid(tenant_spec(tenant)), signal.SIGTERM)
        time.sleep(0.5)  # the stop is asked; the held run keeps the host alive
        conn.request("GET", "/readyz")
        second = conn.getresponse()
        problem = json.loads(second.read())
        assert second.status == 503 and second.will_close and problem["code"] == "not_ready", problem
        conn.close()
    finally:
        chat_release()
