"""Issue 34, the customer's agent as an MCP server: the official `mcp` SDK's client (streamable HTTP) against this
control plane's live server, with a customer token. Listing the agent's kinds as tools, a call submitting a task
through the durable inbox (the instance is not running: the task waits, the answer names it), and another
tenant's token refused."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest

from agent_runtime.mcp.client import run_blocking
from conversations.models import InboxItem
from conversations.tokens import customer_token_issue
from releases.models import AgentRelease, ReleaseAssignment
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tests.test_vault_helpers import make_tenant


def _with_release(tenant: Tenant) -> None:
    release = AgentRelease.objects.create(operator=tenant.operator, version="1.0", distribution="support-agent",
                                          digest="sha256:" + "0" * 64, size_bytes=0,
                                          kinds={"summarize": "Summarize a document", "refund": "Refund an order"})
    ReleaseAssignment.objects.create(tenant=tenant, release=release)


def _session(url: str, token: str, op: Any) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def run() -> Any:
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(create_mcp_http_client(
                headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30)))
            client = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http),
                                                            cache=None, read_timeout_seconds=30))
            return await op(client)

    return run_blocking(run)  # a thread of its own where the browser tests' Playwright runs a loop


@pytest.mark.django_db(transaction=True)
def test_the_mcp_sdk_lists_and_calls_a_customers_agent_with_a_customer_token(live_server) -> None:  # type: ignore[no-untyped-def]
    operator = operator_create(slug="mcp-ep", name="Ops", actor=SYSTEM)
    tenant = make_tenant(operator)
    _with_release(tenant)
    token = customer_token_issue(tenant=tenant, scopes=["tasks:read", "tasks:write"], actor=SYSTEM).plaintext
    url = f"{live_server.url}/api/v1/tenants/{tenant.pk}/mcp"

    async def list_and_call(client: Any) -> tuple[list[Any], Any, Any]:
        tools = (await client.list_tools()).tools
        called = await client.call_tool("run_summarize", {"params": {"doc": "q3.pdf"},
                                                          "idempotency_key": "mcp-1"})
        again = await client.call_tool("run_summarize", {"params": {"doc": "q3.pdf"},
                                                         "idempotency_key": "mcp-1"})
        return tools, called, again

    tools, called, again = _session(url, token, list_and_call)
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"run_summarize", "run_refund", "send_message", "get_task"}
    assert by_name["run_refund"].description == "Refund an order"
    assert by_name["get_task"].annotations.read_only_hint is True
    assert called.is_error is False, called
    answer = called.structured_content
    # No instance runs: the task waits in the durable inbox and the answer names it; the same key, the same task.
    assert answer["status"] == "queued" and answer["task_id"]
    assert again.structured_content["task_id"] == answer["task_id"]
    item = InboxItem.objects.get(pk=answer["task_id"])
    assert item.tenant_id == tenant.pk and item.kind == "task"
    assert item.payload == {"kind": "summarize", "params": {"doc": "q3.pdf"}}
    assert InboxItem.objects.filter(tenant=tenant).count() == 1

    # Without tasks:write the call is refused as a tool error; nothing is submitted.
    reader = customer_token_issue(tenant=tenant, scopes=["tasks:read"], actor=SYSTEM).plaintext
    refused = _session(url, reader, lambda c: c.call_tool("run_refund", {"params": {}}))
    assert refused.is_error is True and "tasks:write" in refused.content[0].text
    assert InboxItem.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_another_tenants_customer_token_is_refused(live_server) -> None:  # type: ignore[no-untyped-def]
    operator = operator_create(slug="mcp-x", name="Ops", actor=SYSTEM)
    tenant_a, tenant_b = make_tenant(operator), make_tenant(operator)
    _with_release(tenant_a)
    token_b = customer_token_issue(tenant=tenant_b, scopes=["tasks:read", "tasks:write"], actor=SYSTEM).plaintext
    url_a = f"{live_server.url}/api/v1/tenants/{tenant_a.pk}/mcp"
    with pytest.raises(BaseException) as refused:
        _session(url_a, token_b, lambda c: c.call_tool("run_summarize", {"params": {}}))
    assert "404" in repr(refused.value) or "not found" in repr(refused.value).lower(), repr(refused.value)
    assert not InboxItem.objects.filter(tenant=tenant_a).exists()
    # B's own endpoint answers B (no release: only the built-in tools).
    url_b = f"{live_server.url}/api/v1/tenants/{tenant_b.pk}/mcp"
    listed = _session(url_b, token_b, lambda c: c.list_tools())
    assert {t.name for t in listed.tools} == {"send_message", "get_task"}
