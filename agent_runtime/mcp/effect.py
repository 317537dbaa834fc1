"""An irreversible MCP tool call as an effect adapter for the ledger (`effects.base.EffectAdapter`).

MCP has no way to ask a server whether it already ran a call: no lookup, and no promise that a repeat with the
same key is answered from a record. So an intent whose outcome is unknown (the process died during the call, a
timeout, a dropped stream) is blocked for a human (`effect_in_doubt`), never called again blind. The ledger's key
still travels in the request's `_meta` (`client.IDEMPOTENCY_META_KEY`), for a server that de-duplicates by it.
"""

from __future__ import annotations

from typing import Any

from agent_runtime.effects.base import LookupResult
from agent_runtime.mcp.client import IDEMPOTENCY_META_KEY, McpConnection

__all__ = ["McpToolEffect"]


class McpToolEffect:
    supports_lookup = False
    replay_safe = False
    lookup_consistency_s = 0.0

    def __init__(self, connection: McpConnection, tool: str) -> None:
        self.connection = connection
        self.tool = tool

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        return self.connection.call_tool(self.tool, args, {IDEMPOTENCY_META_KEY: idem_key})

    def lookup(self, idem_key: str) -> LookupResult:
        raise NotImplementedError("an MCP server cannot be asked whether it ran a call (supports_lookup is False)")
