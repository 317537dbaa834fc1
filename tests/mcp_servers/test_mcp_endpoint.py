"""Issue 34, the customer's agent as an MCP server: the official `mcp` SDK's client (streamable HTTP) against this
control plane's live server, with a customer token. Listing the agent's kinds as tools, a call submitting a task
through the durable inbox (the instance is not running: the task waits, the answer names it), and another
tenant's token refused. The resources (a thread's messages, a task's result) are read from the tenant's instance,
here the protocol stub of tests/instance_stub.py (it checks the control plane's signature as documented). The
tutorial of docs/mcp.md runs here as the page shows it, in a process of its own with only the reader's variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import AsyncExitStack
from typing import Any

import pytest

from agent_runtime.mcp.client import run_blocking
from conversations.models import InboxItem
from conversations.tokens import customer_token_issue
from mcp_servers.agent_endpoint import mcp_answer
from releases.models import AgentRelease, ReleaseAssignment
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tests.conftest import BASE_DIR
from tests.conversation_helpers import stub_tenant
from tests.docblocks import doc_blocks, write_titled_blocks
from tests.vault.test_vault_helpers import make_tenant


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


def _read(client: Any, uri: str) -> Any:
    async def read() -> Any:
        contents = (await client.read_resource(uri)).contents
        assert len(contents) == 1 and contents[0].uri == uri and contents[0].mime_type == "application/json"
        return json.loads(contents[0].text)
    return read()


def _refusal(url: str, token: str, uri: str) -> Any:
    """The JSON-RPC error the SDK raised reading ``uri`` (out of the task groups that wrap it)."""
    from mcp import MCPError

    with pytest.raises(BaseException) as refused:
        _session(url, token, lambda c: c.read_resource(uri))
    error: BaseException = refused.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(refused.value)
    return error


@pytest.mark.django_db(transaction=True)
def test_a_threads_messages_and_a_tasks_result_are_resources_of_the_tenant_only(live_server) -> None:  # type: ignore[no-untyped-def]
    operator = operator_create(slug="mcp-res", name="Ops", actor=SYSTEM)
    tenant, stub = stub_tenant(operator, kinds=("chat", "summarize"))
    other, other_stub = stub_tenant(operator, kinds=("chat",))
    try:
        _with_release(tenant)
        token = customer_token_issue(tenant=tenant, actor=SYSTEM, scopes=[
            "tasks:read", "tasks:write", "conversations:read", "conversations:write"]).plaintext
        url = f"{live_server.url}/api/v1/tenants/{tenant.pk}/mcp"

        async def write(client: Any) -> tuple[Any, Any, Any]:
            templates = (await client.list_resource_templates()).resource_templates
            await client.call_tool("send_message", {"thread": "support-1", "content": "Where is my order?"})
            await client.call_tool("send_message", {"thread": "support-1", "content": "And the invoice?"})
            ran = await client.call_tool("run_summarize", {"params": {"doc": "q3.pdf"}})
            return client.server_capabilities, templates, ran

        capabilities, templates, ran = _session(url, token, write)
        assert capabilities.resources is not None
        assert {t.uri_template for t in templates} == {"thread://{thread}/messages{?limit}", "task://{task_id}"}
        task_id = ran.structured_content["task_id"]
        assert ran.structured_content["status"] == "accepted" and task_id in stub.tasks
        # The agent finishes the task (in the stub's state, as the instance's own tables would say).
        stub.tasks[task_id].update(status="done", result={"summary": "Q3 was good"})

        async def read(client: Any) -> tuple[Any, Any, Any, Any]:
            listed = (await client.list_resources()).resources
            return (listed, await _read(client, "thread://support-1/messages"),
                    await _read(client, "thread://support-1/messages?limit=1"), await _read(client, f"task://{task_id}"))

        listed, thread, newest, task = _session(url, token, read)
        assert f"task://{task_id}" in {r.uri for r in listed}
        assert [(m["role"], m["content"]) for m in thread["messages"]] == [
            ("user", "Where is my order?"), ("assistant", "echo: Where is my order?"),
            ("user", "And the invoice?"), ("assistant", "echo: And the invoice?")]
        assert [m["content"] for m in newest["messages"]] == ["echo: And the invoice?"]
        assert task["status"] == "done" and task["result"] == {"summary": "Q3 was good"}
        assert task["task"]["params"] == {"doc": "q3.pdf"}

        # Another tenant's thread and task, asked on this tenant's endpoint: unknown here, never its data.
        other_stub.threads["private"] = [{"seq": 1, "thread": "private", "role": "user", "content": "B's secret",
                                          "message_id": None, "task": None, "created_at": "2026-01-01T00:00:00Z"}]
        other_task = "11111111-2222-3333-4444-555555555555"
        other_stub.tasks[other_task] = {"id": other_task, "kind": "chat", "status": "done", "result": "B's result"}
        for uri in ("thread://private/messages", f"task://{other_task}"):
            refused = _refusal(url, token, uri)
            assert refused.code == -32602 and refused.message == "resource not found", refused
            assert "B's" not in repr(refused.error)
        # ... and another tenant's token on this endpoint is refused before anything is read.
        other_token = customer_token_issue(tenant=other, scopes=["tasks:read", "conversations:read"],
                                           actor=SYSTEM).plaintext
        with pytest.raises(BaseException) as not_found:
            _session(url, other_token, lambda c: c.read_resource("thread://support-1/messages"))
        assert "404" in repr(not_found.value) or "not found" in repr(not_found.value).lower(), repr(not_found.value)

        # A token without conversations:read reads no thread; the task still answers with tasks:read.
        reader = customer_token_issue(tenant=tenant, scopes=["tasks:read"], actor=SYSTEM).plaintext
        refused = _refusal(url, reader, "thread://support-1/messages")
        assert refused.code == -32003 and "conversations:read" in refused.message
        assert _session(url, reader, lambda c: _read(c, f"task://{task_id}"))["result"] == {"summary": "Q3 was good"}
        # Without tasks:read (the endpoint itself needs it over HTTP; an operator's narrower scope set here) no task.
        answer = mcp_answer({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                             "params": {"uri": f"task://{task_id}"}},
                            tenant=tenant, actor=SYSTEM, scopes={"conversations:read"})
        assert answer is not None and answer["error"]["code"] == -32003 and "tasks:read" in answer["error"]["message"]
        assert mcp_answer({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, tenant=tenant, actor=SYSTEM,
                          scopes={"conversations:read"}) == {"jsonrpc": "2.0", "id": 2, "result": {"resources": []}}

        # The instance down: the read is an error naming the status, for a retry; the listing is empty.
        stub.down = True
        refused = _refusal(url, token, f"task://{task_id}")
        assert refused.code == -32603 and refused.data["status"] == 503, refused.error
        assert _session(url, token, lambda c: c.list_resources()).resources == []
    finally:
        stub.stop()
        other_stub.stop()


@pytest.mark.django_db(transaction=True)
def test_the_tutorial_calls_a_customers_agent_as_the_page_shows(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    written = write_titled_blocks(doc_blocks(BASE_DIR / "docs" / "mcp.md"), tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["mcp-tutorial/call_agent.py"]
    operator = operator_create(slug="mcp-doc", name="Ops", actor=SYSTEM)
    tenant, stub = stub_tenant(operator, kinds=("chat", "summarize"))
    try:
        _with_release(tenant)
        token = customer_token_issue(tenant=tenant, actor=SYSTEM, scopes=[
            "tasks:read", "conversations:read", "conversations:write"]).plaintext
        # The reader's shell: the three variables the page names, nothing of the control plane's.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CP": live_server.url,
               "TENANT": str(tenant.pk), "CUSTOMER_TOKEN": token}
        done = subprocess.run([sys.executable, "mcp-tutorial/call_agent.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        assert lines[0] == "tools: get_task, run_refund, run_summarize, send_message", done.stdout
        assert lines[1] == "resources: thread://{thread}/messages{?limit}, task://{task_id}", done.stdout
        # The message went through the endpoint to the instance, which answered it (the stub echoes) within wait_s.
        assert lines[2] == "task: done", done.stdout
        assert lines[3:5] == ["user: Where is order 42?", "assistant: echo: Where is order 42?"], done.stdout
        assert lines[5] == "task chat done result: null", done.stdout
        assert [m["content"] for m in stub.user_messages("support-1")] == ["Where is order 42?"]
        assert token not in done.stdout + done.stderr
    finally:
        stub.stop()
