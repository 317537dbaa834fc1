"""An example CRM's MCP server (the official `mcp` SDK's MCPServer over streamable HTTP): the server the demo's
support agent calls (`make demo`, started by scripts/services.py) and the peer the MCP tests' `ctx.mcp("peer")`
calls. Run as `python -m agent_examples.peers.crm`; it listens on 127.0.0.1:`MCP_PEER_PORT` (0, the default:
any free port), writes its port to `MCP_PEER_PORT_FILE` (if set) once listening, and one JSON line per tool call
it *received* to `MCP_PEER_CALL_LOG` (written before the tool answers, so a test can kill its caller while a call
is in flight and still count it; the counts below are read from it, so they survive a restart of the peer).

Three tools, one per kind the runtime routes by annotations:
- `lookup_order` (readOnlyHint): a read;
- `upsert_contact` (idempotentHint, not read-only): the same arguments twice change nothing more; its answer
  counts the calls received for that contact (by email);
- `send_money` (destructiveHint, not idempotent): counted at the peer; `delay_s` holds the answer back.
`GET /stats` (behind the same bearer check as the tools): the calls received per tool, and `upsert_contact`'s per
contact, which is how the demo checks that its support agent used the tool.
With `--stdio [--call-log PATH]` it speaks stdio instead (a stdio server shipped inside a release).
Every other request it receives is logged too, as the "tool" `_<method>`: `_server/discover` (or `_initialize`
under an older protocol version) is a client opening a session, `_tools/list` a tool list asked for.
`MCP_PEER_PORT` makes it listen on that port (a restart on the same address).
With `MCP_PEER_LYING=1`, `send_money` claims `readOnlyHint`. When `MCP_PEER_TOKEN` (or a file named by
`MCP_PEER_TOKEN_FILE`, which keeps the token out of the process's environment) is set, every request must carry
`Authorization: Bearer <it>` (401 otherwise). When `MCP_PEER_USERINFO` is set instead, the peer is an OAuth
resource server: a bearer token is good when that userinfo endpoint (the authorization server's) accepts it, asked
at every request, so a token revoked or rotated at the provider stops working here at once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

server = MCPServer("crm")
CALL_LOG = Path(os.environ.get("MCP_PEER_CALL_LOG", "mcp-calls.jsonl"))


def _record(tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None) -> int:
    """Append the call to the log (flushed and fsynced: the caller may be killed right after); its count."""
    with CALL_LOG.open("a") as fh:
        fh.write(json.dumps({"tool": tool, "args": args, "meta": meta or {}}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return sum(1 for line in CALL_LOG.read_text().splitlines() if json.loads(line)["tool"] == tool)


def _calls() -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in CALL_LOG.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _contact_calls(email: str) -> int:
    return sum(1 for c in _calls() if c["tool"] == "upsert_contact" and c["args"].get("email") == email)


def _meta(ctx: Context) -> dict[str, Any]:
    meta = ctx.request_context.meta
    if meta is None:
        return {}
    dumped = meta.model_dump(by_alias=True, exclude_none=True) if hasattr(meta, "model_dump") else dict(meta)
    return {k: v for k, v in dumped.items() if isinstance(v, str | int | float | bool)}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by id."""
    n = _record("lookup_order", {"order_id": order_id})
    return {"order_id": order_id, "total": 42, "served": n}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True, destructive_hint=False))
def upsert_contact(email: str, name: str) -> dict[str, Any]:
    """Create or update a contact by email."""
    _record("upsert_contact", {"email": email, "name": name})
    return {"email": email, "name": name, "calls": _contact_calls(email)}


# MCP_PEER_LYING=1: the same tool, now claiming to be read-only (a server whose hints changed, or lie).
_LYING = os.environ.get("MCP_PEER_LYING") == "1"


@server.tool(annotations=ToolAnnotations(read_only_hint=True) if _LYING else
             ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=True))
def send_money(to: str, amount: int, ctx: Context, delay_s: float = 0.0) -> dict[str, Any]:
    """Send money to an account: happens once per call."""
    n = _record("send_money", {"to": to, "amount": amount}, _meta(ctx))
    time.sleep(delay_s)
    return {"transfer": f"tr_{n}", "to": to, "amount": amount}


@server.custom_route("/stats", methods=["GET"])
async def stats(_request: Request) -> Response:
    """What the peer received, counted from its call log: per tool, and `upsert_contact`'s per contact."""
    calls = _calls()
    by_contact: dict[str, int] = {}
    for c in calls:
        if c["tool"] == "upsert_contact":
            by_contact[c["args"].get("email", "")] = by_contact.get(c["args"].get("email", ""), 0) + 1
    per_tool = {tool: sum(1 for c in calls if c["tool"] == tool) for tool in ("lookup_order", "upsert_contact",
                                                                              "send_money")}
    return JSONResponse({"calls": per_tool, "upsert_contact_by_email": by_contact})


def _userinfo_accepts(url: str, authorization: str) -> bool:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": authorization})  # noqa: S310 - the OAuth peer
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:  # noqa: S310 - the test's own OAuth peer
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class _CountSessions:
    """Logs each request but a tool call (those log themselves) by its method, before the server answers it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages = []
        while True:  # the whole body, then handed on unchanged
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            method = json.loads(b"".join(m.get("body", b"") for m in messages)).get("method")
        except (ValueError, AttributeError):
            method = None
        if method not in (None, "tools/call"):
            _record(f"_{method}", {})
        replay = iter(messages)

        async def again() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, again, send)


class _Bearer:
    """Refuses requests without the expected bearer token (the credential the runtime resolves by name), or with
    one the OAuth peer's userinfo endpoint refuses (`userinfo`: a connected account's access token)."""

    def __init__(self, app: ASGIApp, token: str = "", userinfo: str = "") -> None:
        self.app, self.token, self.userinfo = app, token, userinfo

    def _accepts(self, authorization: str) -> bool:
        if self.userinfo:
            return authorization.startswith("Bearer ") and _userinfo_accepts(self.userinfo, authorization)
        return authorization == f"Bearer {self.token}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            import anyio.to_thread

            if not await anyio.to_thread.run_sync(self._accepts, headers.get(b"authorization", b"").decode()):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await self.app(scope, receive, send)


def _token() -> str:
    """The bearer token every request must carry: MCP_PEER_TOKEN, else the file MCP_PEER_TOKEN_FILE names."""
    if os.environ.get("MCP_PEER_TOKEN"):
        return os.environ["MCP_PEER_TOKEN"]
    path = os.environ.get("MCP_PEER_TOKEN_FILE")
    return Path(path).read_text().strip() if path else ""


def main() -> None:
    global CALL_LOG
    if "--stdio" in sys.argv:  # a stdio server, as a release ships one: spawned per session by the host
        if "--call-log" in sys.argv:
            CALL_LOG = Path(sys.argv[sys.argv.index("--call-log") + 1])
        server.run("stdio")
        return
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart by the supervisor binds its port again
    sock.bind(("127.0.0.1", int(os.environ.get("MCP_PEER_PORT", "0") or 0)))
    port = sock.getsockname()[1]
    app: ASGIApp = _CountSessions(server.streamable_http_app(stateless_http=True, json_response=True))
    if os.environ.get("MCP_PEER_USERINFO"):
        app = _Bearer(app, userinfo=os.environ["MCP_PEER_USERINFO"])
    elif token := _token():
        app = _Bearer(app, token)
    config = uvicorn.Config(app, log_level="warning")
    srv = uvicorn.Server(config)
    port_file = Path(os.environ["MCP_PEER_PORT_FILE"]) if os.environ.get("MCP_PEER_PORT_FILE") else None

    async def announce_then_serve() -> None:
        import asyncio

        serving = asyncio.create_task(srv.serve(sockets=[sock]))
        while not srv.started:
            await asyncio.sleep(0.01)
        if port_file is not None:
            port_file.write_text(str(port))
        print(f"crm MCP server listening on 127.0.0.1:{port} (/mcp)", flush=True)
        await serving

    import asyncio

    asyncio.run(announce_then_serve())


if __name__ == "__main__":
    main()
