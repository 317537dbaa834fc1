"""The instance API under /v1/ (docs/instance-api.md): threads, tasks, effects, events and logs of this instance.

Every request must carry the control plane's signature (`api_auth`); everything else gets 401. Writes go
through the same stores the worker uses, on connections named like the worker's (the fence trigger lets only
the lease holder write), and in one transaction where two facts belong together (a message and its task).
Reads are in `api_queries`. Streams (SSE) poll the database briefly and wake at once on chunks and replies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from agent_runtime.db import connect, reusable
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import EffectLedger
from agent_runtime.host import api_queries as q
from agent_runtime.host.api_auth import signing_key, verify
from agent_runtime.host.logs import log_tail
from agent_runtime.host.release_policy import current_release
from agent_runtime.state import tasks as task_store
from agent_runtime.state import threads
from agent_runtime.state.memory import MemoryStore

if TYPE_CHECKING:
    from agent_runtime.host.process import Host

__all__ = ["ApiError", "InstanceAPI"]

log = logging.getLogger("agent_runtime.host.api")

THREAD = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_UUID = r"[0-9a-fA-F-]{36}"
KEEPALIVE_S = 10.0
POLL_S = 0.25
DECISIONS = ("performed", "not_performed", "perform_now")


class ApiError(Exception):
    """`extra`: members added to the problem (e.g. the task a refusal names), for the control plane to pass on."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}
        self.extra = extra or {}


_TITLES = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
           413: "Payload Too Large", 422: "Unprocessable Entity", 503: "Service Unavailable"}


def _uuid(raw: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise ApiError(404, "not_found", f"no {what} {raw[:60]!r}") from None


def _int(params: dict[str, list[str]], name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = params.get(name, [None])[0]
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "invalid", f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise ApiError(400, "invalid", f"{name} must be between {lo} and {hi}")
    return value


def _fields(body: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise ApiError(400, "invalid", f"unknown fields: {', '.join(unknown)}")
    missing = [f for f in required if f not in body]
    if missing:
        raise ApiError(400, "invalid", f"missing fields: {', '.join(missing)}")


class _Stream:
    """A server-sent event stream on the handler's socket (the response ends when the connection closes)."""

    def __init__(self, req: BaseHTTPRequestHandler) -> None:
        self.req = req
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Cache-Control", "no-cache")
        req.send_header("Connection", "close")
        req.end_headers()
        req.wfile.flush()
        self.last_write = time.monotonic()

    def send(self, event: str, data: Any, event_id: str | None = None) -> None:
        frame = (f"id: {event_id}\n" if event_id else "") + f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"
        self.req.wfile.write(frame.encode())
        self.req.wfile.flush()
        self.last_write = time.monotonic()

    def keepalive(self) -> None:
        if time.monotonic() - self.last_write >= KEEPALIVE_S:
            self.req.wfile.write(b": keep-alive\n\n")
            self.req.wfile.flush()
            self.last_write = time.monotonic()


_DISCARD_MAX = 16 * 1024 * 1024
_DISCARD_TIMEOUT_S = 2.0


def _discard(req: BaseHTTPRequestHandler, length: int) -> None:
    """Read and drop a refused body (up to 16 MB, 2 s per read) before answering 413. Closing with the body
    still unread makes the kernel answer the sender with a reset, which can destroy the 413 on its way: the
    caller then sees a broken pipe instead of the reason (a flaky test showed it)."""
    left = min(length, _DISCARD_MAX)
    req.connection.settimeout(_DISCARD_TIMEOUT_S)
    try:
        while left > 0:
            chunk = req.rfile.read(min(65536, left))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:  # a timeout or a reset: the answer is still attempted, the connection then closed
        return


class InstanceAPI:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.key = signing_key(host.cfg.instance_token) if host.cfg.instance_token else None
        self._idle: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue(maxsize=8)

    # --- plumbing ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def conn(self) -> Iterator[psycopg.Connection]:
        """A connection named like the worker's (the fence admits the lease holder's writes), reused."""
        try:
            c = self._idle.get_nowait()
        except queue.Empty:
            cfg = self.host.cfg
            c = connect(cfg.database_url, cfg.schema, autocommit=True, application_name=self.host.application_name,
                        pooled=cfg.database_pooled)
        try:
            yield c
        except psycopg.Error:
            c.close()
            raise
        if not reusable(c):
            c.close()
            return
        try:
            self._idle.put_nowait(c)
        except queue.Full:
            c.close()

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        try:
            body = self._body(req, method)
            if not verify(self.key, self.host.cfg.tenant_id, req.headers.get("Authorization"), method, req.path, body):
                raise ApiError(401, "unauthorized", "this endpoint accepts only requests signed by the control plane")
            if not self.host.ready.is_set() or self.host.runtime is None:
                raise ApiError(503, "not_ready", self.host.load_error or "the instance is still reading back its state",
                               {"Retry-After": "1"})
            self.route(req, method, url.path, parse_qs(url.query), body)
        except ApiError as exc:
            self.problem(req, exc)
        except psycopg.OperationalError as exc:
            log.warning("instance API: database unavailable", extra={"event": "api_db_error", "error": str(exc)[:200]})
            self.problem(req, ApiError(503, "not_ready", "the database is not answering", {"Retry-After": "1"}))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller went away (a stream's reader disconnected)

    def _body(self, req: BaseHTTPRequestHandler, method: str) -> bytes:
        length = int(req.headers.get("Content-Length") or 0)
        if length > self.host.cfg.api_max_body:
            req.close_connection = True
            _discard(req, length)
            raise ApiError(413, "too_large", f"the body is larger than {self.host.cfg.api_max_body} bytes")
        return req.rfile.read(length) if length > 0 else b""

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_utf8", "the body is not valid UTF-8") from None
        try:
            value = json.loads(text or "{}")
        except ValueError:
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(value, dict):
            raise ApiError(400, "invalid_json", "the body must be a JSON object")
        return value

    def send(self, req: BaseHTTPRequestHandler, status: int, body: dict[str, Any],
             content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, default=str).encode()
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        if req.close_connection:  # e.g. a body too large to read: the client must not send another request here
            req.send_header("Connection", "close")
        req.end_headers()
        req.wfile.write(data)

    def problem(self, req: BaseHTTPRequestHandler, exc: ApiError) -> None:
        self.send(req, exc.status, {"type": "about:blank", "title": _TITLES.get(exc.status, "Error"),
                                    "status": exc.status, "detail": exc.detail, "code": exc.code, **exc.extra},
                  "application/problem+json", exc.headers)

    def route(self, req: BaseHTTPRequestHandler, method: str, path: str, params: dict[str, list[str]],
              body: bytes) -> None:
        routes: list[tuple[str, str, Any]] = [
            ("GET", r"/v1/threads/([^/]+)/messages", self.get_messages),
            ("POST", r"/v1/threads/([^/]+)/messages", self.post_message),
            ("GET", rf"/v1/threads/([^/]+)/messages/({_UUID})/reply", self.stream_reply),
            ("GET", r"/v1/threads/([^/]+)/run", self.get_run),
            ("GET", r"/v1/tasks", self.get_tasks),
            ("POST", r"/v1/tasks", self.post_task),
            ("GET", r"/v1/tasks/([^/]+)", self.get_task),
            ("POST", r"/v1/tasks/([^/]+)/cancel", self.cancel_task),
            ("POST", r"/v1/tasks/([^/]+)/retry", self.retry_task),
            ("GET", r"/v1/effects", self.get_effects),
            ("POST", r"/v1/effects/([^/]+)/decision", self.post_decision),
            ("GET", r"/v1/events", self.stream_events),
            ("GET", r"/v1/logs", self.get_logs),
        ]
        allowed = []
        for verb, pattern, fn in routes:
            m = re.fullmatch(pattern, path)
            if m is None:
                continue
            if verb != method:
                allowed.append(verb)
                continue
            fn(req, params, body, *m.groups())
            return
        if allowed:
            raise ApiError(405, "method_not_allowed", f"use {', '.join(allowed)}", {"Allow": ", ".join(allowed)})
        raise ApiError(404, "not_found", f"no endpoint {path[:100]}")

    @staticmethod
    def _thread(raw: str) -> str:
        if not THREAD.match(raw):
            raise ApiError(400, "invalid", "a thread name is 1 to 200 characters of A-Z a-z 0-9 . _ : -")
        return raw

    def _chat_kind(self) -> str:
        agents = self.host.agents.agents if self.host.agents else {}
        if self.host.cfg.chat_kind:
            if self.host.cfg.chat_kind in agents:
                return self.host.cfg.chat_kind
            raise ApiError(409, "conversations_unsupported", f"AGENT_CHAT_KIND={self.host.cfg.chat_kind!r} is not "
                                                             "an agent of this instance")
        kinds = sorted(k for k, a in agents.items() if getattr(a, "conversational", False))
        if len(kinds) != 1:
            raise ApiError(409, "conversations_unsupported",
                           "this instance's agent does not take messages (no conversational agent)" if not kinds else
                           f"several conversational agents ({', '.join(kinds)}): set AGENT_CHAT_KIND")
        return kinds[0]

    # --- threads -------------------------------------------------------------------------------
    def get_messages(self, req: BaseHTTPRequestHandler, params: dict[str, list[str]], _b: bytes, thread: str) -> None:
        thread = self._thread(thread)
        after = _int(params, "after", None, 0, 2**62)
        before = _int(params, "before", None, 1, 2**62)
        limit = _int(params, "limit", 50, 1, 200) or 50
        with self.conn() as c:
            if not q.thread_exists(c, thread):
                raise ApiError(404, "not_found", f"no thread {thread!r}")
            self.send(req, 200, q.message_page(c, thread, after=after, before=before, limit=limit))

    def post_message(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], body: bytes, thread: str) -> None:
        thread = self._thread(thread)
        data = self._json(body)
        _fields(data, ("id", "content"), ("policy",))
        policy = data.get("policy", "enqueue")
        if policy not in threads.POLICIES:
            raise ApiError(400, "invalid", f"policy must be one of: {', '.join(threads.POLICIES)}")
        mid = _uuid(str(data["id"]), "message id") if isinstance(data["id"], str) else None
        content = data["content"]
        if mid is None:
            raise ApiError(400, "invalid", "id must be a UUID string")
        if not isinstance(content, str) or not content.strip() or "\x00" in content:
            raise ApiError(400, "invalid", "content must be a non-empty string without NUL characters")
        if len(content) > self.host.cfg.message_max_chars:
            raise ApiError(413, "too_large", f"a message is at most {self.host.cfg.message_max_chars} characters")
        kind = self._chat_kind()
        params = {"thread": thread, "question": content, "message_id": str(mid)}
        rt = self.host.runtime
        assert rt is not None
        with self.conn() as c:
            try:
                with c.transaction():
                    # The thread's policy first (it may refuse), then the message and its task, in one transaction.
                    halted = threads.admit(c, thread, mid, policy)
                    task, created = task_store.submit_once(c, mid, kind, params)
                    if created:
                        MemoryStore(c).in_thread(thread).append(
                            "user", content, {"task": str(mid), "turn": "question", "message_id": str(mid)})
            except threads.ThreadBusy as exc:
                raise ApiError(409, "thread_busy", f"{exc}: the thread's policy is reject",
                               extra={"task": {"id": str(exc.run.task_id), "status": exc.run.status}}) from None
            except threads.RollbackRefused as exc:
                raise ApiError(409, "rollback_refused", str(exc), extra={
                    "task": {"id": str(exc.task_id)},
                    "effect": {"key": exc.idem_key, "name": exc.effect, "state": exc.state}}) from None
            if not created and (task.kind, task.params) != (kind, params):
                raise ApiError(409, "conflict", "this message id was already used for another message")
            message = q.question(c, str(mid))
            row = q.task_row(c, mid)
        assert row is not None
        for run in halted:  # the worker stops each at its next step boundary
            rt.halted[str(run.task_id)] = run.status
            log.info("run ended by a new message", extra={"event": "task_halted", "task_id": str(run.task_id),
                                                          "status": run.status, "message_id": str(mid)})
        if halted:
            rt.streams.wake()
        self.host.wake_worker()
        self.send(req, 201 if created else 200, {
            "message": message, "task": q.task_summary(row),
            "halted": [{"id": str(r.task_id), "status": r.status} for r in halted]})

    def get_run(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], _b: bytes, thread: str) -> None:
        """The thread's run still going (pending or running), or null: what the control plane asks before it
        takes a message under the `reject` policy (the answer at delivery, `threads.admit`, is the final one)."""
        thread = self._thread(thread)
        with self.conn() as c:
            runs = threads.going(c, thread)
            row = q.task_row(c, runs[0].task_id) if runs else None
        self.send(req, 200, {"task": q.task_summary(row) if row is not None else None})

    def stream_reply(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], _b: bytes, thread: str,
                     message_id: str) -> None:
        thread = self._thread(thread)
        mid = str(uuid.UUID(message_id))
        with self.conn() as c:
            asked = q.question(c, mid)
        if asked is None or asked["thread"] != thread:
            raise ApiError(404, "not_found", f"no message {mid} in thread {thread!r}")
        rt = self.host.runtime
        assert rt is not None
        stream = _Stream(req)
        deadline = time.monotonic() + self.host.cfg.stream_max_s
        attempt: str | None = None
        index, status = -1, None
        while True:
            with self.conn() as c:
                # Status first, then the reply: the step appends its reply before it commits 'done', so a status
                # that says the task ended is never read before a reply that was committed with it.
                row = q.task_row(c, uuid.UUID(mid))
                reply = q.reply_to(c, mid)
            current = row[2] if row else "missing"
            if reply is not None:
                stream.send("reply", reply)
                stream.send("end", {"status": current})
                return
            if current != status:
                status = current
                stream.send("status", {"status": current, "reason": row[3] if row else None})
            if current in (*task_store.ENDED, "blocked", "missing"):
                stream.send("end", {"status": current})
                return
            if time.monotonic() > deadline:
                stream.send("timeout", {"after_s": self.host.cfg.stream_max_s})
                return
            new_attempt, chunks = rt.streams.read(mid, attempt, index, POLL_S)
            if new_attempt != attempt:
                attempt, index = new_attempt, -1
            for ch in chunks:
                stream.send("delta", {"text": ch.text, "index": ch.index, "attempt": ch.attempt})
                index = ch.index
            stream.keepalive()

    # --- tasks ---------------------------------------------------------------------------------
    def get_tasks(self, req: BaseHTTPRequestHandler, params: dict[str, list[str]], _b: bytes) -> None:
        status = params.get("status", [None])[0] or None
        if status is not None and status not in ("pending", "running", "blocked", *task_store.ENDED):
            raise ApiError(400, "invalid", "unknown status")
        before_raw = params.get("before", [None])[0]
        before = _uuid(before_raw, "task") if before_raw else None
        with self.conn() as c:
            self.send(req, 200, q.task_list(c, status=status, before=before,
                                            limit=_int(params, "limit", 50, 1, 200) or 50))

    def post_task(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], body: bytes) -> None:
        data = self._json(body)
        _fields(data, ("id", "kind"), ("params",))
        if not isinstance(data["id"], str):
            raise ApiError(400, "invalid", "id must be a UUID string")
        tid = _uuid(data["id"], "task id")
        kind, params = data["kind"], data.get("params", {})
        if not isinstance(params, dict):
            raise ApiError(400, "invalid", "params must be a JSON object")
        agents = self.host.agents.agents if self.host.agents else {}
        if not isinstance(kind, str) or kind not in agents:
            raise ApiError(409, "unknown_kind", f"this instance runs {sorted(agents)}, not {str(kind)[:60]!r}")
        with self.conn() as c:
            task, created = task_store.submit_once(c, tid, kind, params)
            row = q.task_row(c, tid)
        if not created and (task.kind, task.params) != (kind, params):
            raise ApiError(409, "conflict", "this task id was already used with another kind or other params")
        assert row is not None
        self.host.wake_worker()
        self.send(req, 201 if created else 200, {"task": q.task_summary(row)})

    def get_task(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], _b: bytes, task_id: str) -> None:
        tid = _uuid(task_id, "task")
        with self.conn() as c:
            row = q.task_row(c, tid)
            if row is None:
                raise ApiError(404, "not_found", f"no task {tid}")
            agent = self.host.agents.agents.get(row[1]) if self.host.agents else None
            names = [s.name for s in agent.steps(row[7])] if agent is not None else []
            self.send(req, 200, q.task_detail(c, tid, names) or {})

    def cancel_task(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], _b: bytes, task_id: str) -> None:
        tid = _uuid(task_id, "task")
        rt = self.host.runtime
        assert rt is not None
        with self.conn() as c:
            done = task_store.cancel(c, tid)
            row = q.task_row(c, tid)
        if row is None:
            raise ApiError(404, "not_found", f"no task {tid}")
        if done is None:
            raise ApiError(409, "conflict", f"the task already ended ({row[2]})")
        rt.cancelled.add(str(tid))
        rt.streams.wake()
        log.info("task cancelled", extra={"event": "task_cancelled", "task_id": str(tid)})
        self.send(req, 200, {"task": q.task_summary(row)})

    def retry_task(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], _b: bytes, task_id: str) -> None:
        """Run a blocked or failed task again from its latest checkpoint (409 in any other state)."""
        tid = _uuid(task_id, "task")
        with self.conn() as c, c.transaction():
            # Read back before the commit: once it commits, its NOTIFY wakes the worker, which may take the task
            # ('running') before a later read. The answer is what the retry did.
            done = task_store.retry(c, tid, current_release(self.host.cfg))
            row = q.task_row(c, tid)
        if row is None:
            raise ApiError(404, "not_found", f"no task {tid}")
        if done is None:
            raise ApiError(409, "conflict", f"only a blocked or failed task can be retried; this one is {row[2]}")
        self.host.wake_worker()
        log.info("task retried", extra={"event": "task_retried", "task_id": str(tid)})
        self.send(req, 200, {"task": q.task_summary(row)})

    # --- effects -------------------------------------------------------------------------------
    def get_effects(self, req: BaseHTTPRequestHandler, params: dict[str, list[str]], _b: bytes) -> None:
        state = params.get("state", ["open"])[0] or "open"
        with self.conn() as c:
            try:
                effects = q.effect_list(c, state=state, limit=_int(params, "limit", 100, 1, 1000) or 100)
            except ValueError as exc:
                raise ApiError(400, "invalid", str(exc)) from None
        self.send(req, 200, {"effects": effects})

    def post_decision(self, req: BaseHTTPRequestHandler, _p: dict[str, list[str]], body: bytes, key: str) -> None:
        data = self._json(body)
        _fields(data, ("decision",), ("result", "decided_by"))
        decision, result, who = data["decision"], data.get("result"), data.get("decided_by", "human")
        if decision not in DECISIONS:
            raise ApiError(400, "invalid", f"decision must be one of: {', '.join(DECISIONS)}")
        if result is not None and not isinstance(result, dict):
            raise ApiError(400, "invalid", "result must be a JSON object")
        if not isinstance(who, str) or len(who) > 200:
            raise ApiError(400, "invalid", "decided_by must be a string of at most 200 characters")
        rt = self.host.runtime
        assert rt is not None
        with self.conn() as c:
            effect = q.effect_get(c, key)
            if effect is None:
                raise ApiError(404, "not_found", "no effect with this key")
            row = q.task_row(c, uuid.UUID(effect["task"]))
            if row is not None and row[2] == "cancelled":
                raise ApiError(409, "conflict", "the effect's task is cancelled: nothing will use this decision")
            try:
                EffectLedger(c, rt.tenant_id, EffectJournal(rt.store)).decide(
                    key, performed=decision == "performed", result=result, decided_by=who,
                    perform=decision == "perform_now")
            except ValueError:
                raise ApiError(409, "conflict", f"the effect is not open (it is {effect['state']})") from None
            effect = q.effect_get(c, key)
        log.info("effect decided", extra={"event": "effect_decided", "idem_key": key, "decision": decision})
        self.host.wake_worker()
        self.send(req, 200, {"effect": effect})

    # --- events and logs -----------------------------------------------------------------------
    def stream_events(self, req: BaseHTTPRequestHandler, params: dict[str, list[str]], _b: bytes) -> None:
        cursor = params.get("after", [None])[0] or req.headers.get("Last-Event-ID") or "s0-h0"
        m = re.fullmatch(r"s(\d{1,18})-h(\d{1,18})", cursor)
        if m is None:
            raise ApiError(400, "invalid", "after must be an event id such as s12-h3")
        s_cur, h_cur = int(m.group(1)), int(m.group(2))
        stream = _Stream(req)
        deadline = time.monotonic() + self.host.cfg.stream_max_s
        while time.monotonic() < deadline and not self.host.stop_event.is_set():
            with self.conn() as c:
                events = q.events_after(c, s_cur, h_cur)
            for event_id, ev in events:
                stream.send(ev.pop("type"), ev, event_id)
                sm = re.fullmatch(r"s(\d+)-h(\d+)", event_id)
                assert sm is not None
                s_cur, h_cur = int(sm.group(1)), int(sm.group(2))
            stream.keepalive()
            time.sleep(POLL_S * 2)
        stream.send("timeout", {"after_s": self.host.cfg.stream_max_s})

    def get_logs(self, req: BaseHTTPRequestHandler, params: dict[str, list[str]], _b: bytes) -> None:
        limit = _int(params, "limit", 200, 1, 2000) or 200
        level = params.get("level", [None])[0]
        self.send(req, 200, {"records": log_tail(self.host.cfg.log_file, limit, level)})
