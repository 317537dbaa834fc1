"""A stand-in for one tenant's instance API (docs/instance-api.md), for control-plane tests (no tests here).

It verifies the documented signature with its own implementation (so a test against it checks the
control plane's signing against the document, not against itself), keeps threads, tasks and effects in
memory and answers as the protocol says. Faults: ``down`` (503 not_ready), ``stop()`` (connection
refused), ``drop_reply_after`` (the reply stream breaks off after n deltas, like a SIGKILLed host).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_AUTH_RE = re.compile(r"^CP-HMAC-SHA256 tenant=([^,\s]+), expires=(\d+), signature=([0-9a-f]{64})$")


def verify(token: str, tenant_id: str, header: str, method: str, path: str, body: bytes, now: float) -> bool:
    m = _AUTH_RE.match(header or "")
    if not m or m.group(1) != tenant_id:
        return False
    expires = int(m.group(2))
    if not now <= expires <= now + 300:
        return False
    key = hmac.new(token.encode(), b"agent-runtime instance-api v1", hashlib.sha256).digest()
    canonical = f"v1\n{method}\n{path}\n{tenant_id}\n{expires}\n{hashlib.sha256(body).hexdigest()}".encode()
    return hmac.compare_digest(hmac.new(key, canonical, hashlib.sha256).hexdigest(), m.group(3))


class StubInstance:
    def __init__(self, tenant_id: str, token: str, *, kinds: tuple[str, ...] = ("demo",)) -> None:
        self.tenant_id, self.token, self.kinds = str(tenant_id), token, kinds
        self.lock = threading.Lock()
        self.threads: dict[str, list[dict[str, Any]]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.effects: dict[str, dict[str, Any]] = {}
        self.spans: dict[str, list[dict[str, Any]]] = {}  # task id -> its trace_spans rows, as GET /v1/tasks/{id}
        self.steps: dict[str, list[dict[str, Any]]] = {}  # task id -> its step rows, as GET /v1/tasks/{id}
        self.posts: list[tuple[str, str]] = []  # (path, message or task id): every accepted write
        self.retries: list[str] = []  # task ids retried (each accepted retry)
        self.refused_auth = 0
        # GET /v1/logs answers the tail of these, oldest first, at or above ?level=, as agent_runtime.host.logs.
        self.log_records: list[dict[str, Any]] = [{"level": "info", "msg": "hello from the stub"}]
        self.down = False
        self.drop_reply_after: int | None = None
        self.reply_words = 3
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # stop() waits for the serve loop's next poll: 0.05 s instead of the default 0.5 s per stub and test.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        from instances.client import forget_tenant

        forget_tenant(self.tenant_id)  # the control plane's kept-alive connections to it, closed: their threads end
        self.server.shutdown()
        self.server.server_close()

    def add_effect(self, task_id: str, state: str = "in_doubt") -> str:
        key = "eff-" + uuid.uuid4().hex
        self.effects[key] = {"key": key, "task": task_id, "step": "pay", "effect": "payments.charge",
                             "state": state, "resolution": None, "result": None, "created_at": _now(),
                             "settled_at": None}
        return key

    def user_messages(self, thread: str) -> list[dict[str, Any]]:
        return [m for m in self.threads.get(thread, []) if m["role"] == "user"]

    # --- the protocol
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any], *, problem: bool = False) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/problem+json" if problem else "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if status == 503:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(raw)

            def _problem(self, status: int, code: str, detail: str) -> None:
                self._send(status, {"type": "about:blank", "title": code, "status": status, "detail": detail,
                                    "code": code}, problem=True)

            def _handle(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not verify(stub.token, stub.tenant_id, self.headers.get("Authorization", ""), method, self.path,
                              body, time.time()):
                    stub.refused_auth += 1
                    return self._problem(401, "unauthorized", "unauthorized")
                if stub.down:
                    return self._problem(503, "not_ready", "the instance is reading back its state")
                try:
                    data = json.loads(body.decode("utf-8")) if body else {}
                except UnicodeDecodeError:
                    return self._problem(400, "invalid_utf8", "the body is not UTF-8")
                except ValueError:
                    return self._problem(400, "invalid_json", "the body is not JSON")
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                with stub.lock:
                    return stub.route(self, method, url.path, query, data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        return Handler

    def route(self, h: Any, method: str, path: str, query: dict[str, str], data: dict[str, Any]) -> None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "threads"] and len(parts) == 4 and parts[3] == "messages":
            return self._messages(h, method, parts[2], query, data)
        if parts[:2] == ["v1", "threads"] and len(parts) == 6 and parts[5] == "reply" and method == "GET":
            return self._reply(h, parts[2], parts[4])
        if path == "/v1/tasks":
            return self._tasks(h, method, query, data)
        if parts[:2] == ["v1", "tasks"] and len(parts) == 3 and method == "GET":
            task = self.tasks.get(parts[2])
            if task is None:
                return h._problem(404, "not_found", "no such task")
            effects = [e for e in self.effects.values() if e["task"] == parts[2]]
            return h._send(200, {"task": task, "steps": self.steps.get(parts[2], []), "events": [],
                                 "case_file": {"done": [], "waiting_on": None, "ruled_out": [], "notes": []},
                                 "effects": effects, "judgments": [], "result": task.get("result"),
                                 "spans": self.spans.get(parts[2], [])})
        if parts[:2] == ["v1", "tasks"] and len(parts) == 4 and parts[3] == "cancel" and method == "POST":
            task = self.tasks.get(parts[2])
            if task is None:
                return h._problem(404, "not_found", "no such task")
            if task["status"] in ("done", "failed", "cancelled"):
                return h._problem(409, "conflict", f"the task is already {task['status']}")
            task["status"] = "cancelled"
            return h._send(200, {"task": task})
        if parts[:2] == ["v1", "tasks"] and len(parts) == 4 and parts[3] == "retry" and method == "POST":
            task = self.tasks.get(parts[2])
            if task is None:
                return h._problem(404, "not_found", "no such task")
            if task["status"] not in ("blocked", "failed"):
                return h._problem(409, "conflict", f"only a blocked or failed task can be retried; this one is "
                                                   f"{task['status']}")
            task.update(status="pending", blocked_reason=None, blocked_detail=None)
            self.retries.append(parts[2])
            return h._send(200, {"task": task})
        if path == "/v1/effects" and method == "GET":
            state = query.get("state", "open")
            rows = [e for e in self.effects.values()
                    if state == "all" or e["state"] == state or (state == "open" and e["state"] in ("in_doubt",
                                                                                                    "blocked"))]
            return h._send(200, {"effects": rows})
        if parts[:2] == ["v1", "effects"] and len(parts) == 4 and parts[3] == "decision" and method == "POST":
            effect = self.effects.get(parts[2])
            if effect is None:
                return h._problem(404, "not_found", "no such effect")
            task = self.tasks.get(effect["task"], {})
            who = data.get("decided_by", "human")
            if not isinstance(who, str) or len(who) > 200:  # as agent_runtime.host.api refuses it
                return h._problem(400, "invalid", "decided_by must be a string of at most 200 characters")
            if effect["state"] not in ("in_doubt", "blocked") or task.get("status") == "cancelled":
                return h._problem(409, "conflict", "the effect is not open or its task is cancelled")
            effect.update(state="committed" if data.get("decision") == "performed" else "failed",
                          resolution={"decision": data.get("decision"), "decided_by": data.get("decided_by")},
                          result=data.get("result"), settled_at=_now())
            return h._send(200, {"effect": effect})
        if path == "/v1/logs" and method == "GET":
            levels = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
            floor = levels.get(query.get("level") or "", 0)
            kept = [r for r in self.log_records if levels.get(str(r.get("level")), 0) >= floor]
            return h._send(200, {"records": kept[-int(query.get("limit") or 200):]})
        return h._problem(404, "not_found", "no such endpoint")

    def _messages(self, h: Any, method: str, thread: str, query: dict[str, str], data: dict[str, Any]) -> None:
        if method == "GET":
            if thread not in self.threads:
                return h._problem(404, "not_found", "no such thread")
            msgs = self.threads[thread]
            limit = int(query.get("limit", 50))
            return h._send(200, {"thread": thread, "messages": msgs[-limit:], "next": None, "prev": None})
        mid, content = str(data.get("id", "")), data.get("content")
        if not isinstance(content, str) or not content:
            return h._problem(400, "invalid", "content is required")
        if len(content) > 32_000:
            return h._problem(413, "too_large", "content is too long")
        if "demo" not in self.kinds and "chat" not in self.kinds:
            return h._problem(409, "conversations_unsupported", "this instance runs no conversation agent")
        if mid in self.tasks:
            existing = next(m for m in self.threads[thread] if m["message_id"] == mid and m["role"] == "user")
            if existing["content"] != content:
                return h._problem(409, "conflict", "this id was used with other content")
            return h._send(200, {"message": existing, "task": self.tasks[mid]})
        log = self.threads.setdefault(thread, [])
        msg = {"seq": len(log) + 1, "thread": thread, "role": "user", "content": content, "message_id": mid,
               "task": mid, "created_at": _now()}
        log.append(msg)
        self.tasks[mid] = {"id": mid, "kind": "chat", "status": "done", "blocked_reason": None,
                           "blocked_detail": None, "created_at": _now(), "updated_at": _now()}
        log.append({"seq": len(log) + 1, "thread": thread, "role": "assistant", "content": f"echo: {content}",
                    "message_id": None, "task": mid, "created_at": _now()})
        self.posts.append((f"/v1/threads/{thread}/messages", mid))
        return h._send(201, {"message": msg, "task": self.tasks[mid]})

    def _reply(self, h: Any, thread: str, mid: str) -> None:
        reply = next((m for m in self.threads.get(thread, []) if m["task"] == mid and m["role"] == "assistant"),
                     None)
        if reply is None:
            return h._problem(404, "not_found", "no such message")
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        h.end_headers()
        words = reply["content"].split(" ")
        for i, word in enumerate(words[: self.reply_words]):
            if self.drop_reply_after is not None and i >= self.drop_reply_after:
                h.wfile.flush()
                h.close_connection = True
                return
            h.wfile.write(f"event: delta\ndata: {json.dumps({'text': word, 'index': i, 'attempt': 'a1'})}\n\n"
                          .encode())
            h.wfile.flush()
        h.wfile.write(f"event: reply\ndata: {json.dumps(reply)}\n\n".encode())
        h.wfile.write(b'event: end\ndata: {"status": "done"}\n\n')
        h.wfile.flush()
        h.close_connection = True

    def _tasks(self, h: Any, method: str, query: dict[str, str], data: dict[str, Any]) -> None:
        if method == "GET":
            rows = sorted(self.tasks.values(), key=lambda t: t["created_at"], reverse=True)
            if query.get("status"):
                rows = [t for t in rows if t["status"] == query["status"]]
            return h._send(200, {"tasks": rows[: int(query.get("limit", 50))], "next": None})
        tid, kind, params = str(data.get("id", "")), data.get("kind"), data.get("params", {})
        if kind not in self.kinds:
            return h._problem(409, "unknown_kind", f"this instance does not run {kind!r}")
        if tid in self.tasks:
            same = self.tasks[tid]["kind"] == kind and self.tasks[tid]["params"] == params
            return h._send(200, {"task": self.tasks[tid]}) if same else h._problem(409, "conflict", "id reused")
        self.tasks[tid] = {"id": tid, "kind": kind, "params": params, "status": "pending", "blocked_reason": None,
                           "blocked_detail": None, "created_at": _now(), "updated_at": _now()}
        self.posts.append(("/v1/tasks", tid))
        return h._send(201, {"task": self.tasks[tid]})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z"
