"""A local chat model speaking the OpenAI chat-completions wire format (`python -m agent_examples.peers.chat_model`).

`POST /v1/chat/completions` answers like the OpenAI API: `{"id": "chatcmpl-...", "object": "chat.completion",
"choices": [{"index": 0, "message": {...}, "finish_reason": "tool_calls" | "stop"}], "usage": {...}}`, with
`tool_calls` as `{"id": "call_...", "type": "function", "function": {"name", "arguments": "<JSON string>"}}`.
Errors use OpenAI's shape (`{"error": {"message", "type", "code"}}`): 401 without the right bearer key, 400 for
a malformed body. `GET /v1/models` lists the one model.

Its behaviour is deterministic (ids are random, as OpenAI's are), decided on the current turn, i.e. the
messages after the last user message, and only with tools the request offers:
1. the question names an order ("order 1042", "#1042") and `lookup_order` was not called yet: call it;
2. it asks for a refund, a ticket, a human or reports damage and `open_ticket` was not called yet: call it;
3. it gives an email address ("my email is ada@example.com") and `upsert_contact` is offered (an MCP server's tool,
   `mcp_server` in the support agent's configuration) and was not called yet: call it with the address;
4. no order, no tool result yet, and `search_kb` offered: call it with the question;
5. otherwise answer with content that quotes every tool result of the turn.

Every request is appended to the JSONL log `AGENT_CHAT_LOG` when it arrives (a completion is paid for when it
is requested, whether or not its caller lives to read it), with a digest of its messages and tools, so tests
can count completions and tell a repeated prompt from a new one. `AGENT_CHAT_HOLD_FILE`: while that file
exists, a completion whose turn already holds a tool result is held (a slow model in the middle of a tool
loop) until the file is removed. Env: AGENT_CHAT_API_KEY (required bearer key, default "sk-local"),
AGENT_CHAT_MODEL (default "local-support"), AGENT_CHAT_PORT (0 = ephemeral), AGENT_SINK_PORT_FILE.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent_examples.peers._serve import announce, serve_until_signal

__all__ = ["ChatModelServer", "decide", "main"]

HOLD_LIMIT_S = 120.0  # a forgotten hold file must not pin a handler thread forever

_ORDER = re.compile(r"(?:\border\b\s*(?:number|no\.?)?\s*#?\s*|#)(\d{3,})", re.IGNORECASE)
_ESCALATE = re.compile(r"\b(refund|ticket|human|broken|damaged)\b", re.IGNORECASE)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _current_turn(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = str(messages[last_user].get("content") or "") if last_user >= 0 else ""
    return question, messages[last_user + 1:]


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def decide(messages: list[dict[str, Any]], offered: set[str]) -> dict[str, Any]:
    """The assistant message for `messages` (the rules in the module docstring); no I/O."""
    question, turn = _current_turn(messages)
    called = {c["function"]["name"] for m in turn if m.get("role") == "assistant"
              for c in m.get("tool_calls") or []}
    results = [m for m in turn if m.get("role") == "tool"]
    order = _ORDER.search(question)
    if order and "lookup_order" in offered and "lookup_order" not in called:
        return {"role": "assistant", "content": None,
                "tool_calls": [_tool_call("lookup_order", {"order_id": order.group(1)})]}
    escalate = _ESCALATE.search(question)
    if escalate and "open_ticket" in offered and "open_ticket" not in called:
        subject = f"Order {order.group(1)}: {question}" if order else question
        priority = "high" if escalate.group(1).lower() in ("refund", "broken", "damaged") else "normal"
        return {"role": "assistant", "content": None,
                "tool_calls": [_tool_call("open_ticket", {"summary": subject[:160], "priority": priority})]}
    email = _EMAIL.search(question)
    if email and "upsert_contact" in offered and "upsert_contact" not in called:
        return {"role": "assistant", "content": None, "tool_calls": [_tool_call(
            "upsert_contact", {"email": email.group(0), "name": email.group(0).split("@")[0].title()})]}
    if not order and not results and "search_kb" in offered and "search_kb" not in called:
        return {"role": "assistant", "content": None,
                "tool_calls": [_tool_call("search_kb", {"query": question[:200]})]}
    names = {c["id"]: c["function"]["name"] for m in turn if m.get("role") == "assistant"
             for c in m.get("tool_calls") or []}
    if not results:
        return {"role": "assistant", "content": f"Thanks for your message: {question[:200]}"}
    quoted = "; ".join(f"{names.get(str(m.get('tool_call_id')), 'tool')} says {m.get('content')}" for m in results)
    return {"role": "assistant", "content": f"Here is what I found. {quoted}"}


class ChatModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], *, api_key: str, model: str, log_path: str | None,
                 hold_file: str | None) -> None:
        super().__init__(addr, ChatHandler)
        self.api_key = api_key
        self.model = model
        self.log_path = log_path
        self.hold_file = Path(hold_file) if hold_file else None
        self.lock = threading.Lock()
        self.requests = 0

    def record(self, entry: dict[str, Any]) -> int:
        with self.lock:
            self.requests += 1
            entry = {"n": self.requests, **entry}
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            return self.requests

    def hold(self) -> None:
        deadline = time.monotonic() + HOLD_LIMIT_S
        while self.hold_file is not None and self.hold_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatModelServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller died while the model was thinking (a killed host): nothing to answer

    def error(self, code: int, message: str, kind: str, error_code: str | None = None) -> None:
        self.send_json(code, {"error": {"message": message, "type": kind, "param": None, "code": error_code}})

    def authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.server.api_key}".encode()):
            return True
        self.error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        return False

    def do_GET(self) -> None:  # noqa: N802
        if self.path != "/v1/models":
            self.error(404, f"Unknown request URL: GET {self.path}.", "invalid_request_error", "unknown_url")
            return
        if self.authorized():
            self.send_json(200, {"object": "list", "data": [{"id": self.server.model, "object": "model",
                                                             "created": 0, "owned_by": "local"}]})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/chat/completions":
            self.error(404, f"Unknown request URL: POST {self.path}.", "invalid_request_error", "unknown_url")
            return
        if not self.authorized():
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            messages = body["messages"]
            model = body["model"]
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise ValueError("messages")
        except (ValueError, KeyError, TypeError):
            self.error(400, "'model' and a non-empty list of 'messages' are required.", "invalid_request_error")
            return
        tools = body.get("tools") or []
        offered = {t["function"]["name"] for t in tools if isinstance(t, dict) and t.get("type") == "function"}
        message = decide(messages, offered)
        _question, turn = _current_turn(messages)
        held = self.server.hold_file is not None and self.server.hold_file.exists() and any(
            m.get("role") == "tool" for m in turn)
        digest = hashlib.sha256(json.dumps([messages, tools], sort_keys=True).encode()).hexdigest()
        calls = [c["function"]["name"] for c in message.get("tool_calls") or []]
        self.server.record({"at": time.time(), "model": model, "digest": digest,
                            "roles": [m.get("role") for m in messages], "tools": sorted(offered),
                            "answer": "tool_calls:" + ",".join(calls) if calls else "stop", "held": held})
        if held:
            self.server.hold()
        prompt_tokens = max(1, len(json.dumps(messages)) // 4)
        completion_tokens = max(1, len(json.dumps(message)) // 4)
        self.send_json(200, {
            "id": "chatcmpl-" + secrets.token_hex(12), "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": "fp_local",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}})


def main() -> None:
    server = ChatModelServer(("127.0.0.1", int(os.environ.get("AGENT_CHAT_PORT", "0"))),
                             api_key=os.environ.get("AGENT_CHAT_API_KEY", "sk-local"),
                             model=os.environ.get("AGENT_CHAT_MODEL", "local-support"),
                             log_path=os.environ.get("AGENT_CHAT_LOG"),
                             hold_file=os.environ.get("AGENT_CHAT_HOLD_FILE"))
    announce(server, "chat model")
    serve_until_signal(server)


if __name__ == "__main__":
    main()
