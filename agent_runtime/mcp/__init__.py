"""MCP tools for agents: the servers an instance may call and where each call of theirs goes.

An MCP tool call is read-only, idempotent or an irreversible effect, by the tool's annotations (`readOnlyHint`,
`idempotentHint`) unless the configuration overrides them per tool (`mcp.config`); `mcp.routing` decides the
kind, `mcp.client` speaks the protocol (the official `mcp` SDK, streamable HTTP), `mcp.effect` is the effect
adapter the ledger performs an irreversible call through. The SDK's `ctx.mcp(server)` (`sdk.mcp`) ties them to
the tool cache and the effect ledger.
"""
