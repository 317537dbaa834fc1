"""`ctx.mcp("server")`: an MCP server's tools from a step, each call going where its kind belongs.

- read-only (the tool's `readOnlyHint`, or the operator's override) -> the tool-output cache, keyed by server,
  server URL, tool and arguments, under the server's credential: a replay is served the recorded output while
  the credential holds, and a revoked one serves nothing;
- idempotent (`idempotentHint`) -> called; after a crash the step's replay simply calls it again;
- anything else -> the effect ledger, as the effect `mcp:<server>/<tool>`: intent committed before the call,
  outcome after; a replay returns the recorded result without calling, and a call whose outcome is unknown is
  blocked for a human (`effect_in_doubt`), since an MCP server cannot be asked whether it ran it.

The server's tool list (which carries the annotations) is asked for once per step attempt and server, and answered
by the process's open session for that server while its list is younger than `mcp.client.TOOLS_TTL_S`; read-only
and idempotent calls go over that open session too, an effect's call over a session of its own. Before a call
is routed anywhere but the ledger, the ledger is asked whether it already holds that call as an effect: a server
that changed a tool's hints (or an operator its pin) between a crash and the replay cannot turn a recorded effect
into a fresh call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_runtime.host.connections import TaskConnectionSource
from agent_runtime.mcp.client import McpConnection
from agent_runtime.mcp.config import McpServerSpec
from agent_runtime.mcp.effect import McpToolEffect
from agent_runtime.mcp.routing import chat_tools, tool_kind

if TYPE_CHECKING:
    from agent_runtime.sdk.context import Context

__all__ = ["McpServer", "McpToolNotAllowed"]


class McpToolNotAllowed(PermissionError):
    """The server's `allowed_tools` (the operator's registry entry) does not list this tool: nothing is sent."""


class McpServer:
    """One configured MCP server as a step sees it (`ctx.mcp(name)`)."""

    def __init__(self, ctx: Context, spec: McpServerSpec) -> None:
        self._ctx = ctx
        self.spec = spec
        # Connections asked for by this task: an end user's task gets that end user's (docs/connections.md).
        self._connection = McpConnection(spec, ctx.credentials, TaskConnectionSource(ctx.rt.connections, ctx.task_id))
        self._listed: dict[str, dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def _tools(self) -> dict[str, dict[str, Any]]:
        # A failure propagates: a revoked credential makes the step wait on it (CredentialUnavailable), a server
        # that cannot answer fails the attempt like any error, retried up to the step's attempts.
        if self._listed is None:
            self._listed = {t["name"]: t for t in self._connection.list_tools() if self.spec.allows(t["name"])}
        return self._listed

    @property
    def connection(self) -> McpConnection:
        """How to reach the server (for an integration that routes effects through its own ledger keys)."""
        return self._connection

    def described(self) -> list[dict[str, Any]]:
        """The allowed tools as the server describes them (name, description, inputSchema, annotations)."""
        return list(self._tools().values())

    def tools(self) -> list[dict[str, Any]]:
        """The server's tools, shaped for a chat model's `tools=` (OpenAI-compatible function tools)."""
        return chat_tools(self.name, list(self._tools().values()))

    def kind(self, tool: str) -> str:
        """Where a call of `tool` goes: 'read_only', 'idempotent' or 'effect'."""
        if tool in self.spec.tools:
            return tool_kind(self.spec, tool, None)
        return tool_kind(self.spec, tool, self._tools().get(tool))

    def call(self, tool: str, args: dict[str, Any] | None = None, *, key: str | None = None) -> dict[str, Any]:
        """Call `tool` with `args`; its result as JSON (`content`, `structuredContent`, `isError`).

        `key`: for an effect, the explicit idempotency key (as `ctx.effect(..., key=)`): one call for this tenant
        across all tasks. Without it the n-th call of this tool in the step is the same call on every replay.
        """
        if not self.spec.allows(tool):
            raise McpToolNotAllowed(f"MCP server {self.name!r} does not allow the tool {tool!r} (allowed_tools)")
        args = dict(args or {})
        effect_name = f"mcp:{self.name}/{tool}"
        ordinal = self._ctx._next_ordinal(effect_name) if key is None else 0
        kind = self.kind(tool)
        if kind != "effect" and self._ctx._ledger_knows(effect_name, ordinal, key):
            kind = "effect"  # recorded as an effect before: its record answers, whatever hints or pins say now
        if kind != "effect" and self.spec.connection is not None:
            self._connection.connections.token(self.spec.connection)  # not connected: nothing served or sent
        if kind == "read_only":
            pinned = self.spec.tools.get(tool)
            return self._ctx.tool(effect_name, {"url": self.spec.endpoint, "arguments": args},
                                  lambda: self._connection.call_tool(tool, args, repeatable=True),
                                  credential=self.spec.credential, ttl=pinned.ttl_s if pinned else None)
        if kind == "idempotent":
            if self.spec.credential is not None:
                self._ctx.credential(self.spec.credential)  # revoked: the step waits on it, nothing is sent
            return self._connection.call_tool(tool, args, repeatable=True)
        return self._ctx._ledger_effect(effect_name, McpToolEffect(self._connection, tool), args, ordinal=ordinal,
                                        key=key)
