"""One MCP server, spoken to with the official `mcp` SDK over streamable HTTP, from synchronous step code.

Reads, idempotent calls and tool lists go through a session kept open in the host process (`_SessionPool`): one
per (server, endpoint, token), living on one background event loop, so a call is one request instead of
initialize + call + close (the cost issue 34's bench measured). The key holds a digest of the bearer token (a
credential's name and version, or a connection's current access token), so a rotated token gets a new session and
the old one is closed; an instance is one tenant, so nothing is shared across tenants. A pooled session that fails
is dropped and the call made once more on a fresh one: only for calls that may be repeated (read-only,
idempotent, tools/list). An effect's call still opens a session of its own, so what its failure means to the
ledger stays exact: a session that could not be opened never sent the call. A stdio server is spawned per session
as before (nothing pooled).

The bearer token is read from the credential source right before each call, so a revoked credential stops the
next call and its value is never kept beyond the open session's headers.

What a failure means to the effect ledger: a session that could not be opened never sent the call
(`ProviderUnreachable`); a JSON-RPC error saying the request itself was wrong (unknown method, invalid params)
is a refusal (`ProviderRejected`); anything once the call was sent (a timeout, a dropped connection, another
error) is "outcome unknown" and propagates as is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar, cast

from agent_runtime.effects.base import ProviderRejected, ProviderUnreachable
from agent_runtime.mcp.config import McpServerSpec

if TYPE_CHECKING:
    from mcp import Client

__all__ = ["IDEMPOTENCY_META_KEY", "McpConnection", "close_pooled_sessions"]

# The `_meta` entry an effect's call carries: its ledger key, so a server that honours it can de-duplicate a
# repeat (the runtime never repeats an effect blind; a human's "perform again" after a doubt sends the same key).
IDEMPOTENCY_META_KEY = "dev.agent-runtime/idempotency-key"
# JSON-RPC: the request named no such method, or its parameters were refused before anything ran.
_REFUSALS = (-32601, -32602)
# How long a pooled session's tool list (and so each tool's annotations, the kind of its calls) is reused before
# it is asked for again: a server that changes a tool's hints is heard within this long.
TOOLS_TTL_S = 60.0

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


class _Pooled:
    """One open session, owned by a task of the pool's loop (anyio's scopes must be left by the task that entered
    them): `open()` starts it and waits until it is usable; `close()` ends it."""

    def __init__(self, opener: Callable[[AsyncExitStack], Awaitable[Client]]) -> None:
        self._opener = opener
        self.client: Client | None = None
        self.tools: tuple[float, list[dict[str, Any]]] | None = None  # (fetched at, the server's list)
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._error: BaseException | None = None
        self.dead = False

    async def _main(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                self.client = await self._opener(stack)
                self._ready.set()
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the session
            self._error = exc
        finally:
            self.dead = True
            self._ready.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main())  # held: a task nobody holds may vanish

    async def open(self) -> Client:
        """The session's client once open (another caller may be opening it: this waits for the same one)."""
        await self._ready.wait()
        if self.client is None or self.dead:
            if isinstance(self._error, ProviderUnreachable):
                raise self._error
            raise ProviderUnreachable(f"MCP session: {_cause(self._error or RuntimeError('closed'))}")
        return self.client

    def close(self) -> None:
        self.dead = True
        self._closing.set()


class _SessionPool:
    """The host process's open MCP sessions, on one daemon thread running an event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[tuple[str, ...], _Pooled] = {}

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcp-sessions", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._running_loop()).result()  # type: ignore[arg-type]

    async def session(self, key: tuple[str, ...], opener: Callable[[AsyncExitStack], Awaitable[Client]]
                      ) -> _Pooled:
        """The open session for `key`; a new one when none is (or it died). Sessions of the same server under
        another token are closed: a rotated or revoked token's session is not kept."""
        held = self._sessions.get(key)
        if held is not None and not held.dead:
            await held.open()  # opened already, or being opened by a concurrent call
            return held
        for other, pooled in list(self._sessions.items()):
            if other[:2] == key[:2] and other != key or pooled.dead:
                pooled.close()
                del self._sessions[other]
        pooled = _Pooled(opener)
        self._sessions[key] = pooled
        pooled.start()
        try:
            await pooled.open()
        except BaseException:
            self._sessions.pop(key, None)
            raise
        return pooled

    def forget(self, key: tuple[str, ...]) -> None:
        pooled = self._sessions.pop(key, None)
        if pooled is not None:
            pooled.close()

    def drop(self, key: tuple[str, ...], pooled: _Pooled) -> None:
        pooled.close()
        if self._sessions.get(key) is pooled:
            del self._sessions[key]

    def close_all(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            for pooled in self._sessions.values():
                pooled.close()
            self._sessions.clear()
            await asyncio.sleep(0)

        self.run(close())


_POOL = _SessionPool()


def close_pooled_sessions() -> None:
    """Close every session the process keeps open (tests; a host shutting down need not: the process ends)."""
    _POOL.close_all()


class _Stale(Exception):  # noqa: N818 - internal signal, never seen outside this module
    """A pooled session failed a repeatable operation: it is dropped and the operation made once more."""


class McpConnection:
    """How to reach one configured server: `list_tools()` and `call_tool()`, on the process's pooled session
    (reads, idempotent calls, tool lists) or on a session of their own (effects, stdio servers)."""

    def __init__(self, spec: McpServerSpec, credentials: Any, connections: Any = None) -> None:
        self.spec = spec
        self.credentials = credentials
        self.connections = connections

    def _token(self) -> tuple[str | None, str]:
        """The bearer token now, and what a pooled session is keyed by: the credential's name and version with a
        digest of the value (an access token's digest for a connection), never the value itself."""
        if self.spec.connection is not None and self.connections is not None:
            # ConnectionUnavailable (not connected, needs the customer) propagates before anything is sent.
            value = str(self.connections.token(self.spec.connection).value)
            return value, f"connection:{self.spec.connection}:{_digest(value)}"
        if self.spec.credential is None:
            return None, "-"
        # CredentialUnavailable propagates before anything is sent: the ledger counts the call as not reached.
        held = self.credentials.get(self.spec.credential)
        return str(held.value), f"credential:{held.name}:{held.version}:{_digest(str(held.value))}"

    def _opener(self, token: str | None) -> Callable[[AsyncExitStack], Awaitable[Client]]:
        # Imported here: an instance whose agents call no MCP server does not load the SDK (or need it installed).
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        spec = self.spec

        async def open_(stack: AsyncExitStack) -> Client:
            try:
                if spec.module is not None:  # spawned for this session, ended with it
                    return await stack.enter_async_context(
                        Client(_stdio_params(spec.module, spec.args), cache=None,
                               read_timeout_seconds=spec.timeout_s))
                http = await stack.enter_async_context(create_mcp_http_client(
                    headers=headers, timeout=httpx2.Timeout(spec.timeout_s)))
                return await stack.enter_async_context(
                    Client(streamable_http_client(spec.url, http_client=http), cache=None,
                           read_timeout_seconds=spec.timeout_s))
            except Exception as exc:  # the session never opened: no tool call was sent
                raise ProviderUnreachable(f"MCP server {spec.name!r}: {_cause(exc)}") from exc

        return open_

    def _own_session(self, op: Callable[[Client, _Pooled | None], Awaitable[T]]) -> T:
        """`op` on a session opened for it and closed after it (an effect's call; a stdio server)."""
        opener = self._opener(self._token()[0])

        async def run() -> T:
            async with AsyncExitStack() as stack:
                client = await opener(stack)
                return await op(client, None)

        try:
            return run_blocking(run)
        except BaseExceptionGroup as group:
            # anyio's task groups wrap what a request raised; the ledger must see the exception itself.
            raise _single(group) from group

    def _pooled(self, op: Callable[[Client, _Pooled | None], Awaitable[T]]) -> T:
        """`op` (repeatable: a read, an idempotent call, tools/list) on the pooled session of this server and
        token; once more on a fresh one when the pooled session fails it (closed by the server, expired)."""
        if self.spec.module is not None:
            return self._own_session(op)
        token, auth = self._token()
        key = (self.spec.name, self.spec.endpoint, auth, repr(self.spec.timeout_s))
        opener = self._opener(token)

        async def run(retry: bool) -> T:
            try:  # bounded: a server that accepts the connection and never answers cannot hang the step
                pooled = await asyncio.wait_for(_POOL.session(key, opener), self.spec.timeout_s)
            except TimeoutError:
                _POOL.forget(key)
                raise ProviderUnreachable(f"MCP server {self.spec.name!r}: no session within "
                                          f"{self.spec.timeout_s:g}s") from None
            assert pooled.client is not None
            try:
                return await op(pooled.client, pooled)
            except ProviderRejected:
                raise
            except Exception as exc:
                _POOL.drop(key, pooled)
                if retry:
                    raise _Stale from exc
                raise

        try:
            try:
                return _POOL.run(run(True))
            except _Stale:
                return _POOL.run(run(False))
        except BaseExceptionGroup as group:
            raise _single(group) from group

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools as the protocol describes them (name, description, inputSchema, annotations); the
        pooled session's list while younger than TOOLS_TTL_S."""

        async def op(client: Client, pooled: _Pooled | None) -> list[dict[str, Any]]:
            if pooled is not None and pooled.tools is not None and time.monotonic() - pooled.tools[0] < TOOLS_TTL_S:
                return list(pooled.tools[1])
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            for _page in range(100):  # a paginator that never ends cannot hang a step
                page = await client.list_tools(cursor=cursor)
                tools.extend(t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            if pooled is not None:
                pooled.tools = (time.monotonic(), tools)
            return list(tools)

        return self._pooled(op)

    def call_tool(self, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None, *,
                  repeatable: bool = False) -> dict[str, Any]:
        """The tool's result as JSON: `content`, `structuredContent` (when the tool gives one) and `isError` (the
        tool ran and reported an error: an answer, recorded like any other). `repeatable`: the call may be made
        twice (read-only, idempotent), so it may use the pooled session; otherwise (an effect) it gets a session
        of its own, whose failure to open proves nothing was sent."""

        from mcp import MCPError

        async def op(client: Client, _pooled: _Pooled | None) -> dict[str, Any]:
            try:
                result = await client.call_tool(tool, args, meta=cast(Any, meta))
            except MCPError as exc:
                if exc.code in _REFUSALS:
                    raise ProviderRejected(f"MCP server {self.spec.name!r} refused {tool!r}: {exc}") from exc
                raise
            dumped = result.model_dump(by_alias=True, exclude_none=True, mode="json")
            return {k: dumped[k] for k in ("content", "structuredContent", "isError") if k in dumped}

        return self._pooled(op) if repeatable else self._own_session(op)


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


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


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
