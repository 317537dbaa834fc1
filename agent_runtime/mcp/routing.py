"""Where an MCP tool call goes, decided from the tool's annotations and the operator's override. No I/O here.

MCP's annotations are hints a server gives about its own tools; the runtime takes them at their word only as far
as the safe direction allows. The default for a tool that says nothing is the safest kind (an effect, as the
spec's defaults say: not read-only, not idempotent), and an operator can pin any tool's kind, or stop trusting a
server's hints (`trust_annotations: false`: everything not pinned is an effect).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_runtime.mcp.config import McpServerSpec

__all__ = ["chat_tools", "tool_kind"]


def tool_kind(spec: McpServerSpec, tool: str, described: Mapping[str, Any] | None) -> str:
    """'read_only' | 'idempotent' | 'effect' for `tool`, given its description from the server's list (None: the
    server does not list it, which is an effect: nothing vouches for it)."""
    pinned = spec.tools.get(tool)
    if pinned is not None:
        return pinned.kind
    if not spec.trust_annotations or described is None:
        return "effect"
    hints = described.get("annotations") or {}
    if hints.get("readOnlyHint") is True:
        return "read_only"
    if hints.get("idempotentHint") is True:
        return "idempotent"
    return "effect"


def chat_tools(server: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools in the shape OpenAI-compatible chat models take (`ChatModel.complete(tools=...)`): a function
    per tool, its parameters the tool's input schema. Names stay the server's: the model's tool call names the
    tool to pass to `ctx.mcp(server).call`."""
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description") or t.get("title") or f"{t['name']} on {server}",
        "parameters": t.get("inputSchema") or {"type": "object", "properties": {}}}} for t in tools]
