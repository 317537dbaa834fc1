"""Issue 34 end to end, both directions at once, with a real ``agent-host`` started by the local driver through the
real onboarding (a real Celery worker, a live web server):

- the customer's agent calls an MCP server (the official `mcp` SDK's server, its own process) registered for it in
  the registry with ``connection: acme``: the bearer token is the customer's connected account's current access
  token (the real OAuth 2.0 peer of tests/oauth_peer.py), fetched at call time; the MCP server checks it at the
  provider on every request. ``allowed_tools`` filters what ``.tools()`` offers and refuses the rest before
  anything is sent;
- the task is started through the customer's MCP endpoint (``run_<kind>`` with ``wait_s``) by the `mcp` SDK's
  client with a customer token, and its result comes back in the tool's answer, and again as the ``task://``
  resource;
- the instance put to sleep (scale to zero) is woken by the next MCP call, which still answers with the result.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from conversations.tokens import customer_token_issue
from provisioning.choices import InstanceStatus
from provisioning.fleet.sleep import instance_sleep
from provisioning.models import AgentInstance, InstanceWake
from releases.assignments import release_default_set
from releases.services import release_create
from tenants.actors import SYSTEM
from tenants.services import operator_create
from tenants.tokens import operator_token_issue
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.connections.test_connections import register
from tests.connections.test_connections_instance import connect_latest
from tests.mcp_servers.test_mcp_endpoint import _session
from tests.oauth_peer import OAuthPeer
from tests.releases.test_releases_upload import make_wheel
from tests.runtime.test_mcp_tools import McpPeer, start_mcp_peer

AGENT = '''
from agent_runtime.sdk import Agent
from agent_runtime.sdk.mcp import McpToolNotAllowed

agent = Agent("crm", connections=["acme"])  # the MCP server is reached with the "acme" account


@agent.step
def look(ctx):
    crm = ctx.mcp("crm")
    offered = sorted(t["function"]["name"] for t in crm.tools())
    order = crm.call("lookup_order", {"order_id": ctx.params["order"]})
    try:
        crm.call("send_money", {"to": "acct_x", "amount": 1})
        refused = None
    except McpToolNotAllowed as exc:
        refused = str(exc)
    return {"offered": offered, "order": order["structuredContent"], "refused": refused}
'''


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    settings.MCP_SERVERS_ALLOW_HTTP = True
    with OAuthPeer() as running:
        yield running


@pytest.fixture
def crm(peer: OAuthPeer, tmp_path: Path) -> Iterator[McpPeer]:
    running = start_mcp_peer(tmp_path, tmp_path / "mcp-calls.jsonl", MCP_PEER_USERINFO=f"{peer.issuer}/userinfo")
    try:
        yield running
    finally:
        running.proc.stop()


def _run(url: str, token: str, order: str, key: str) -> Any:
    return _session(url, token, lambda c: c.call_tool("run_crm", {
        "params": {"order": order}, "idempotency_key": key, "wait_s": 120}))


@pytest.mark.django_db(transaction=True)
def test_a_connected_account_reaches_an_mcp_server_through_the_agent_started_and_woken_over_mcp(
        live_server, worker_factory, settings, peer: OAuthPeer, crm: McpPeer) -> None:  # type: ignore[no-untyped-def]
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    settings.MCP_ENDPOINT_WAIT_S = 120
    operator = operator_create(slug=f"mcpi-{secrets.token_hex(3)}", name="MCP operator", actor=SYSTEM)
    filename, data = make_wheel("crm-agent", f"1.0.{secrets.randbelow(10**6)}", module=AGENT,
                                entry_points="[agent_runtime.agents]\ncrm = crm_agent:agent\n")
    release = release_create(operator=operator, actor=SYSTEM, filename=filename, data=data)
    release_default_set(operator=operator, release_id=release.pk, actor=SYSTEM)
    # The worker hears its hosts' exits: a sleep must not look like a death.
    worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, RELEASES_ROOT=str(root), LOCAL_EXIT_NOTICE="true")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {operator_token_issue(operator=operator, actor=SYSTEM).plaintext}")
    try:
        tenant = onboard_ready(operator, f"mcpi-{secrets.token_hex(3)}")
        assert register(api, peer).status_code == 201
        connect_latest(api, tenant)
        registered = api.post(f"/api/v1/tenants/{tenant.pk}/mcp-servers", {
            "name": "crm", "url": crm.url, "connection": "acme",
            "allowed_tools": ["lookup_order", "upsert_contact"]}, format="json")
        assert registered.status_code == 201, registered.content
        token = customer_token_issue(tenant=tenant, scopes=["tasks:read", "tasks:write"], actor=SYSTEM).plaintext
        url = f"{live_server.url}/api/v1/tenants/{tenant.pk}/mcp"

        first = _run(url, token, "o-1", "mcp-inst-1")
        assert first.is_error is False, first
        body = first.structured_content
        assert body["status"] == "done", json.dumps(body, default=str)[:3000]
        result = body["result"]
        # The agent saw only the allowed tools, read the order with the connected account's token (the MCP server
        # asked the provider), and the tool not allowed was refused before anything was sent.
        assert result["offered"] == ["lookup_order", "upsert_contact"], body
        assert result["order"]["order_id"] == "o-1"
        assert "does not allow the tool 'send_money'" in result["refused"]
        assert len(crm.calls("lookup_order")) == 1
        assert crm.calls("send_money") == []
        # The same task read back as an MCP resource, from the real instance's task table.
        read = _session(url, token, lambda c: c.read_resource(f"task://{body['task_id']}"))
        as_resource = json.loads(read.contents[0].text)
        assert as_resource["status"] == "done" and as_resource["result"] == result, as_resource
        assert as_resource["task"]["kind"] == "crm" and as_resource["task"]["params"] == {"order": "o-1"}

        # Scale to zero: the instance sleeps; the next MCP call wakes it and still answers with the result.
        # (Until its heartbeat says the finished task's step is over, the instance is busy, never put to sleep.)
        assert wait_for(lambda: instance_sleep(instance=AgentInstance.objects.get(tenant=tenant), idle_s=0)
                        == "asleep", timeout=60, what="the instance asleep")
        assert AgentInstance.objects.get(tenant=tenant).status == InstanceStatus.ASLEEP
        second = _run(url, token, "o-2", "mcp-inst-2")
        assert second.is_error is False, second
        assert second.structured_content["status"] == "done", json.dumps(second.structured_content, default=str)
        assert second.structured_content["result"]["order"]["order_id"] == "o-2"
        assert InstanceWake.objects.filter(tenant=tenant).count() == 1
        assert AgentInstance.objects.get(tenant=tenant).status != InstanceStatus.ASLEEP
        assert len(crm.calls("lookup_order")) == 2
    finally:
        kill_session_instances()
        shutil.rmtree(root, ignore_errors=True)
