"""The MCP server specs and the routing of a tool by its annotations: pure functions, no server and no database."""

from __future__ import annotations

import json

import pytest

from agent_runtime.errors import ConfigError
from agent_runtime.host.config import HostConfig
from agent_runtime.mcp.config import McpSpecInvalid, servers_from_config, servers_validate
from agent_runtime.mcp.routing import chat_tools, tool_kind

URL = "https://crm.example/mcp"


@pytest.mark.parametrize(("servers", "field"), [
    ([], ""),
    ({"crm": "https://crm.example/mcp"}, "crm"),
    ({"crm": {"url": "ftp://crm.example/mcp"}}, "crm.url"),
    ({"crm": {"url": URL, "token": "s3cret"}}, "crm.token"),  # a value where only a credential's name may go
    ({"crm": {"url": URL, "credential": ""}}, "crm.credential"),
    ({"crm": {"url": URL, "timeout_s": 0}}, "crm.timeout_s"),
    ({"crm": {"url": URL, "trust_annotations": "yes"}}, "crm.trust_annotations"),
    ({"crm": {"url": URL, "tools": {"pay": "maybe"}}}, "crm.tools.pay.kind"),
    ({"crm": {"url": URL, "tools": {"pay": {"kind": "effect", "ttl_s": 60}}}}, "crm.tools.pay.ttl_s"),
    ({"crm": {"url": URL, "tools": {"pay": {"kind": "effect", "retries": 3}}}}, "crm.tools.pay.retries"),
])
def test_an_unusable_spec_is_refused_naming_its_field(servers: object, field: str) -> None:
    with pytest.raises(McpSpecInvalid) as caught:
        servers_validate(servers)
    assert caught.value.field == field


def test_a_spec_reads_back_with_its_overrides() -> None:
    specs = servers_from_config({"mcp": {"crm": {"url": URL, "credential": "crm-token", "tools": {
        "find": {"kind": "read_only", "ttl_s": 60}, "pay": "effect"}}}, "language": "fr"})
    crm = specs["crm"]
    assert (crm.url, crm.credential, crm.trust_annotations, crm.timeout_s) == (URL, "crm-token", True, 30.0)
    assert (crm.tools["find"].kind, crm.tools["find"].ttl_s, crm.tools["pay"].kind) == ("read_only", 60.0, "effect")
    assert servers_from_config({"language": "fr"}) == {}


def test_the_host_refuses_an_unusable_AGENT_MCP_SERVERS_at_start() -> None:
    env = {"AGENT_TENANT_ID": "6f1b7c1e-0b7e-4c43-9d43-0d7c1e0b7e4c", "AGENT_SCHEMA": "t_x",
           "AGENT_DATABASE_URL": "postgresql://x", "AGENT_VOLUME": "/tmp/x", "AGENT_OBJECTSTORE_URL": "file:///tmp/x/",
           "AGENT_OBJECT_KEY": "A" * 43 + "="}
    assert HostConfig.from_env({**env, "AGENT_MCP_SERVERS": json.dumps({"crm": {"url": URL}})}).mcp_servers_env
    with pytest.raises(ConfigError, match="crm.url"):
        HostConfig.from_env({**env, "AGENT_MCP_SERVERS": '{"crm": {"url": "crm.example"}}'})
    with pytest.raises(ConfigError, match="not valid JSON"):
        HostConfig.from_env({**env, "AGENT_MCP_SERVERS": "{"})


def _tool(**hints: bool) -> dict[str, object]:
    return {"name": "t", "inputSchema": {"type": "object"}, "annotations": hints}


def test_a_tool_goes_where_its_annotations_say_and_nothing_unsaid_is_trusted() -> None:
    crm = servers_validate({"crm": {"url": URL}})["crm"]
    assert tool_kind(crm, "t", _tool(readOnlyHint=True)) == "read_only"
    assert tool_kind(crm, "t", _tool(readOnlyHint=False, idempotentHint=True)) == "idempotent"
    assert tool_kind(crm, "t", _tool(destructiveHint=False)) == "effect"  # additive is still an effect
    assert tool_kind(crm, "t", {"name": "t"}) == "effect"  # no annotations: the spec's defaults
    assert tool_kind(crm, "t", None) == "effect"  # not listed by the server
    wary = servers_validate({"crm": {"url": URL, "trust_annotations": False, "tools": {"find": "read_only"}}})["crm"]
    assert tool_kind(wary, "t", _tool(readOnlyHint=True)) == "effect"
    assert tool_kind(wary, "find", _tool(readOnlyHint=False)) == "read_only"  # the operator pinned it


def test_the_tool_list_is_shaped_for_a_chat_model() -> None:
    listed = [{"name": "find", "description": "Find an order.", "inputSchema": {
        "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}, {"name": "ping"}]
    assert chat_tools("crm", listed) == [
        {"type": "function", "function": {"name": "find", "description": "Find an order.", "parameters": {
            "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}},
        {"type": "function", "function": {"name": "ping", "description": "ping on crm", "parameters": {
            "type": "object", "properties": {}}}}]


def test_a_stdio_server_is_the_releases_or_the_instances_never_a_customers_configuration(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from agent_runtime.mcp.client import _stdio_params
    from agent_runtime.mcp.config import servers_from_env
    from agent_runtime.sdk import Agent

    bundled = {"tools": {"module": "pkg.server", "args": ["--flag"]}}
    assert servers_validate(bundled, stdio=True)["tools"].endpoint == "stdio:pkg.server --flag"
    assert servers_from_env(json.dumps(bundled))["tools"].module == "pkg.server"
    assert Agent("bundles", mcp_servers=bundled).mcp_servers["tools"].args == ("--flag",)
    for servers, field in ((bundled, "tools.module"),  # a customer's configuration may not spawn anything
                           ({"t": {"module": "pkg.server", "url": URL}}, "t.url")):
        with pytest.raises(McpSpecInvalid) as caught:
            servers_from_config({"mcp": servers}) if field == "tools.module" else servers_validate(servers, stdio=True)
        assert caught.value.field == field
    for bad, field in (({"module": "pkg server"}, "t.module"), ({"module": "pkg", "credential": "x"}, "t.credential"),
                       ({"module": "pkg", "args": "--flag"}, "t.args"), ({"url": URL, "args": []}, "t.args")):
        with pytest.raises(McpSpecInvalid) as caught:
            servers_validate({"t": bad}, stdio=True)
        assert caught.value.field == field
    with pytest.raises(McpSpecInvalid):
        Agent("bundles-bad", mcp_servers={"t": {"module": "pkg", "credential": "x"}})
    # The spawned server gets no AGENT_* variable (no secret), only the SDK's defaults and PYTHONPATH.
    monkeypatch.setenv("AGENT_CREDENTIAL_CRM", "s3cret")
    monkeypatch.setenv("PYTHONPATH", "/opt/release")
    params = _stdio_params("pkg.server", ("--flag",))
    assert params.args == ["-m", "pkg.server", "--flag"] and params.env["PYTHONPATH"] == "/opt/release"
    assert not any(k.startswith("AGENT_") for k in params.env) and "s3cret" not in json.dumps(params.env)
