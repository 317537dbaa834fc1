"""One MCP server, spoken to with the official `mcp` SDK over streamable HTTP, from synchronous step code.

Each operation opens its own session (connect, negotiate, one request, close) inside `anyio.run`: a step is
plain synchronous code, and a session kept across steps would outlive the process that a crash ends anyway.
The bearer token is read from the credential source right before connecting, so a revoked credential stops the
next call and its value is never kept.

What a failure means to the effect ledger: a session that could not be opened never sent the call
(`ProviderUnreachable`); a JSON-RPC error saying the request itself was wrong (unknown method, invalid params)
is a refusal (`ProviderRejected`); anything once the call was sent (a timeout, a dropped connection, another
error) is "outcome unknown" and propagates as is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar, cast

from agent_runtime.effects.base import ProviderRejected, ProviderUnreachable
from agent_runtime.mcp.config import McpServerSpec

if TYPE_CHECKING:
    from mcp import Client

__all__ = ["IDEMPOTENCY_META_KEY", "McpConnection"]

# The `_meta` entry an effect's call carries: its ledger key, so a server that honours it can de-duplicate a
# repeat (the runtime never repeats an effect blind; a human's "perform again" after a doubt sends the same key).
IDEMPOTENCY_META_KEY = "dev.agent-runtime/idempotency-key"
# JSON-RPC: the request named no such method, or its parameters were refused before anything ran.
_REFUSALS = (-32601, -32602)

T = TypeVar("T")


def run_blocking(run: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(run)`` from synchronous code, also where this thread already runs an event loop (a step called
    from async code, a LangGraph graph run with ``ainvoke``, Playwright's sync API in the same process): there a
    new loop cannot start, so the session runs on a thread of its own and this one waits for it."""
    import anyio  # here: an instance whose agents call no MCP server does not load it

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(run)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-session") as pool:
        return pool.submit(anyio.run, run).result()


class McpConnection:
    """How to reach one configured server: `list_tools()` and `call_tool()`, each one session."""

    def __init__(self, spec: McpServerSpec, credentials: Any, connections: Any = None) -> None:
        self.spec = spec
        self.credentials = credentials
        self.connections = connections

    def _headers(self) -> dict[str, str]:
        if self.spec.connection is not None and self.connections is not None:
            # ConnectionUnavailable (not connected, needs the customer) propagates before anything is sent.
            return {"Authorization": f"Bearer {self.connections.token(self.spec.connection).value}"}
        if self.spec.credential is None:
            return {}
        # CredentialUnavailable propagates before anything is sent: the ledger counts the call as not reached.
        return {"Authorization": f"Bearer {self.credentials.get(self.spec.credential).value}"}

    def _session(self, op: Callable[[Client], Awaitable[T]]) -> T:
        # Imported here: an instance whose agents call no MCP server does not load the SDK (or need it installed).
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = self._headers()
        timeout = httpx2.Timeout(self.spec.timeout_s)

        async def run() -> T:
            async with AsyncExitStack() as stack:
                try:
                    if self.spec.module is not None:  # spawned for this session, ended with it
                        client = await stack.enter_async_context(
                            Client(_stdio_params(self.spec.module, self.spec.args), cache=None,
                                   read_timeout_seconds=self.spec.timeout_s))
                    else:
                        http = await stack.enter_async_context(create_mcp_http_client(headers=headers,
                                                                                      timeout=timeout))
                        client = await stack.enter_async_context(
                            Client(streamable_http_client(self.spec.url, http_client=http), cache=None,
                                   read_timeout_seconds=self.spec.timeout_s))
                except Exception as exc:  # the session never opened: no tool call was sent
                    raise ProviderUnreachable(f"MCP server {self.spec.name!r}: {_cause(exc)}") from exc
                return await op(client)

        try:
            return run_blocking(run)
        except BaseExceptionGroup as group:
            # anyio's task groups wrap what a request raised; the ledger must see the exception itself.
            raise _single(group) from group

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools as the protocol describes them (name, description, inputSchema, annotations)."""

        async def op(client: Client) -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            for _page in range(100):  # a paginator that never ends cannot hang a step
                page = await client.list_tools(cursor=cursor)
                tools.extend(t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools

        return self._session(op)

    def call_tool(self, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The tool's result as JSON: `content`, `structuredContent` (when the tool gives one) and `isError` (the
        tool ran and reported an error: an answer, recorded like any other)."""

        from mcp import MCPError

        async def op(client: Client) -> dict[str, Any]:
            try:
                result = await client.call_tool(tool, args, meta=cast(Any, meta))
            except MCPError as exc:
                if exc.code in _REFUSALS:
                    raise ProviderRejected(f"MCP server {self.spec.name!r} refused {tool!r}: {exc}") from exc
                raise
            dumped = result.model_dump(by_alias=True, exclude_none=True, mode="json")
            return {k: dumped[k] for k in ("content", "structuredContent", "isError") if k in dumped}

        return self._session(op)


def _stdio_params(module: str, args: tuple[str, ...]) -> Any:
    """A stdio server shipped inside the release: this interpreter (the release's environment) runs the module,
    as a child of the host (inside its sandbox), with the SDK's default environment (no AGENT_* variable, no
    secret) plus PYTHONPATH."""
    import os
    import sys

    from mcp.client.stdio import StdioServerParameters, get_default_environment

    env = get_default_environment()
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return StdioServerParameters(command=sys.executable, args=["-m", module, *args], env=env)


def _single(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _cause(exc: BaseException) -> str:
    """The innermost message of an exception group or chain (anyio wraps a task group's failures)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]
