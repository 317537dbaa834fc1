"""The instance API (docs/instance-api.md) against a real agent-host: signatures, threads and replies streamed as
server-sent events, tasks, cancels, human decisions on effects, events, logs, bad input, and a SIGKILL while a
reply is being produced. The signing here follows the document, not the runtime's own module."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.db import connect

from .blocked_effects import plant_blocked_email
from .conftest import HostRunner, TenantDB, make_env
from .test_host import wait_status

APP = "tests.runtime.agents:AGENTS"


def sign(token: str, tenant: str, method: str, path: str, body: bytes, expires: int | None = None) -> str:
    key = hmac.new(token.encode(), b"agent-runtime instance-api v1", hashlib.sha256).digest()
    exp = int(time.time()) + 60 if expires is None else expires
    msg = "\n".join(("v1", method, path, tenant, str(exp), hashlib.sha256(body).hexdigest())).encode()
    return f"CP-HMAC-SHA256 tenant={tenant}, expires={exp}, signature={hmac.new(key, msg, hashlib.sha256).hexdigest()}"


class Client:
    def __init__(self, hosts: HostRunner, env: dict[str, str]) -> None:
        self.hosts, self.env = hosts, env

    @property
    def port(self) -> int:
        return self.hosts.port(self.env)

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             auth: str | None | bool = True) -> tuple[int, dict[str, Any]]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        headers = {"Content-Type": "application/json"}
        if auth is True:
            headers["Authorization"] = sign(self.env["AGENT_INSTANCE_TOKEN"], self.env["AGENT_TENANT_ID"], method,
                                            path, data)
        elif isinstance(auth, str):
            headers["Authorization"] = auth
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request(method, path, body=data, headers=headers)
            resp = c.getresponse()
            text = resp.read()
            return resp.status, json.loads(text) if text else {}
        finally:
            c.close()

    def events(self, path: str, *, until: str = "end", timeout: float = 20) -> list[tuple[str, Any]]:
        """Read a server-sent event stream until the event `until` (or the connection ends)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("GET", path, headers={"Authorization": sign(self.env["AGENT_INSTANCE_TOKEN"],
                                                              self.env["AGENT_TENANT_ID"], "GET", path, b"")})
        resp = c.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("Content-Type") == "text/event-stream"
        out: list[tuple[str, Any]] = []
        event = None
        try:
            while True:
                line = resp.fp.readline()
                if not line:
                    break
                line = line.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event:
                    out.append((event, json.loads(line[6:])))
                    if event == until:
                        break
        except (ConnectionError, OSError):
            pass  # the instance died mid-stream
        finally:
            c.close()
        return out


def api_env(tenant_db: TenantDB, base: Path, **extra: str) -> dict[str, str]:
    return make_env(tenant_db, base, AGENT_APP=APP, AGENT_INSTANCE_TOKEN=secrets.token_urlsafe(32), **extra)


@pytest.fixture
def api(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> Client:
    env = api_env(tenant_db, tmp_path, AGENT_SMTP_URL="smtp://127.0.0.1:9", AGENT_MESSAGE_MAX_CHARS="1000")
    hosts.start(env)
    hosts.wait_ready(env)
    return Client(hosts, env)


def count(t: TenantDB, query: str, *args: Any) -> int:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        return int(c.execute(query, args).fetchone()[0])


def test_only_the_control_planes_signature_opens_the_api(api: Client, tenant_db: TenantDB) -> None:
    path = "/v1/tasks"
    assert api.call("GET", path, auth=None)[0] == 401
    assert api.call("GET", path, auth="Bearer " + api.env["AGENT_INSTANCE_TOKEN"])[0] == 401
    other_token = secrets.token_urlsafe(32)  # another tenant's instance, signing with its own valid secret
    assert api.call("GET", path, auth=sign(other_token, api.env["AGENT_TENANT_ID"], "GET", path, b""))[0] == 401
    assert api.call("GET", path, auth=sign(api.env["AGENT_INSTANCE_TOKEN"], str(uuid.uuid4()), "GET", path,
                                           b""))[0] == 401  # right key, another tenant named
    expired = sign(api.env["AGENT_INSTANCE_TOKEN"], api.env["AGENT_TENANT_ID"], "GET", path, b"",
                   expires=int(time.time()) - 1)
    assert api.call("GET", path, auth=expired)[0] == 401
    far = sign(api.env["AGENT_INSTANCE_TOKEN"], api.env["AGENT_TENANT_ID"], "GET", path, b"",
               expires=int(time.time()) + 3600)
    assert api.call("GET", path, auth=far)[0] == 401
    # A signature for one path or body does not open another.
    signed_list = sign(api.env["AGENT_INSTANCE_TOKEN"], api.env["AGENT_TENANT_ID"], "GET", "/v1/tasks", b"")
    assert api.call("GET", "/v1/logs", auth=signed_list)[0] == 401
    body = json.dumps({"id": str(uuid.uuid4()), "kind": "chat", "params": {}}).encode()
    signed_body = sign(api.env["AGENT_INSTANCE_TOKEN"], api.env["AGENT_TENANT_ID"], "POST", path, body)
    status, problem = api.call("POST", path, raw=body.replace(b"chat", b"demo"), auth=signed_body)
    assert status == 401 and problem["code"] == "unauthorized"
    assert api.env["AGENT_INSTANCE_TOKEN"] not in json.dumps(problem)
    assert count(tenant_db, "SELECT count(*) FROM tasks") == 0
    assert api.call("GET", path)[0] == 200
    assert api.hosts.get(api.env, "/healthz")[0] == 200  # probes stay open


def test_a_message_is_answered_once_and_streamed(api: Client, tenant_db: TenantDB) -> None:
    mid = str(uuid.uuid4())
    status, body = api.call("POST", "/v1/threads/cust-1/messages", {"id": mid, "content": "where is my parcel"})
    assert status == 201, body
    assert body["message"]["role"] == "user" and body["message"]["message_id"] == mid
    assert body["task"]["id"] == mid and body["task"]["kind"] == "chat"
    events = api.events(f"/v1/threads/cust-1/messages/{mid}/reply")
    kinds = [e for e, _ in events]
    assert kinds[-2:] == ["reply", "end"], events
    assert events[-2][1]["content"] == "echo: where is my parcel" and events[-2][1]["role"] == "assistant"
    # Retrying the same message id writes nothing new; another content under it is refused.
    again = api.call("POST", "/v1/threads/cust-1/messages", {"id": mid, "content": "where is my parcel"})
    assert again[0] == 200 and again[1]["message"]["seq"] == body["message"]["seq"]
    assert api.call("POST", "/v1/threads/cust-1/messages", {"id": mid, "content": "other"})[0] == 409
    status, page = api.call("GET", "/v1/threads/cust-1/messages")
    assert status == 200 and [m["role"] for m in page["messages"]] == ["user", "assistant"]
    assert count(tenant_db, "SELECT count(*) FROM messages WHERE thread = 'cust-1'") == 2
    # A reply that exists is sent at once.
    assert [e for e, _ in api.events(f"/v1/threads/cust-1/messages/{mid}/reply")] == ["reply", "end"]


def test_thread_pages_walk_both_ways(api: Client) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for i, mid in enumerate(ids):
        assert api.call("POST", "/v1/threads/pages/messages", {"id": mid, "content": f"question {i}"})[0] == 201
        api.events(f"/v1/threads/pages/messages/{mid}/reply")
    status, latest = api.call("GET", "/v1/threads/pages/messages?limit=2")
    assert status == 200 and [m["content"] for m in latest["messages"]] == ["question 2", "echo: question 2"]
    assert latest["next"] is None and latest["prev"] is not None
    older = api.call("GET", f"/v1/threads/pages/messages?before={latest['prev']}&limit=10")[1]
    assert len(older["messages"]) == 4 and older["prev"] is None and older["next"] is not None
    newer = api.call("GET", f"/v1/threads/pages/messages?after={older['next']}&limit=10")[1]
    assert [m["seq"] for m in newer["messages"]] == [m["seq"] for m in latest["messages"]]
    # Both cursors: the window strictly between them, read from `after` on, `next` kept inside it.
    seqs = [m["seq"] for m in older["messages"]] + [m["seq"] for m in latest["messages"]]
    window = api.call("GET", f"/v1/threads/pages/messages?after={seqs[0]}&before={seqs[4]}&limit=2")[1]
    assert [m["seq"] for m in window["messages"]] == seqs[1:3] and window["next"] == seqs[2]
    rest = api.call("GET", f"/v1/threads/pages/messages?after={window['next']}&before={seqs[4]}&limit=2")[1]
    assert [m["seq"] for m in rest["messages"]] == seqs[3:4] and rest["next"] is None


def test_bad_input_is_refused_without_writing(api: Client, tenant_db: TenantDB) -> None:
    ok_id = str(uuid.uuid4())
    cases = [
        ("POST", "/v1/threads/t/messages", {"id": ok_id, "content": "x" * 1001}, None, 413, "too_large"),
        ("POST", "/v1/threads/t/messages", None, b'{"id": "' + ok_id.encode() + b'", "content": "\xff\xfe"}', 400,
         "invalid_utf8"),
        ("POST", "/v1/threads/t/messages", None, b"{not json", 400, "invalid_json"),
        ("POST", "/v1/threads/t/messages", {"id": ok_id, "content": "hi", "role": "system"}, None, 400, "invalid"),
        ("POST", "/v1/threads/t/messages", {"id": "not-a-uuid", "content": "hi"}, None, 404, "not_found"),
        ("POST", "/v1/threads/t/messages", {"id": ok_id, "content": "nul\x00"}, None, 400, "invalid"),
        ("POST", "/v1/threads/bad%20name/messages", {"id": ok_id, "content": "hi"}, None, 400, "invalid"),
        ("GET", "/v1/threads/nobody-here/messages", None, None, 404, "not_found"),
        ("GET", f"/v1/threads/t/messages/{ok_id}/reply", None, None, 404, "not_found"),
        ("POST", "/v1/tasks", {"id": ok_id, "kind": "no-such-kind"}, None, 409, "unknown_kind"),
        ("GET", f"/v1/tasks/{ok_id}", None, None, 404, "not_found"),
        ("POST", f"/v1/tasks/{ok_id}/cancel", None, None, 404, "not_found"),
        ("POST", "/v1/effects/eff-nope/decision", {"decision": "performed"}, None, 404, "not_found"),
        ("GET", "/v1/effects?state=weird", None, None, 400, "invalid"),
        ("DELETE", "/v1/tasks", None, None, 405, "method_not_allowed"),
    ]
    for method, path, body, raw, want, code in cases:
        status, problem = api.call(method, path, body, raw=raw)
        assert (status, problem.get("code")) == (want, code), (method, path, status, problem)
        assert problem["status"] == want and problem["title"]
    big = json.dumps({"id": ok_id, "content": "y" * (2 << 20)}).encode()
    assert api.call("POST", "/v1/threads/t/messages", raw=big)[0] == 413  # over AGENT_API_MAX_BODY
    assert count(tenant_db, "SELECT count(*) FROM messages") == 0
    assert count(tenant_db, "SELECT count(*) FROM tasks") == 0


def test_tasks_list_detail_and_cancel(api: Client, tenant_db: TenantDB, tmp_path: Path) -> None:
    done_id = str(uuid.uuid4())
    assert api.call("POST", "/v1/tasks", {"id": done_id, "kind": "chat", "params": {"thread": "ops",
                                                                                    "question": "ping"}})[0] == 201
    assert api.call("POST", "/v1/tasks", {"id": done_id, "kind": "chat", "params": {"thread": "ops",
                                                                                    "question": "ping"}})[0] == 200
    assert api.call("POST", "/v1/tasks", {"id": done_id, "kind": "chat", "params": {}})[0] == 409
    deadline = time.monotonic() + 15
    while api.call("GET", f"/v1/tasks/{done_id}")[1]["task"]["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    detail = api.call("GET", f"/v1/tasks/{done_id}")[1]
    assert detail["steps"][0]["name"] == "answer" and detail["steps"][0]["status"] == "done"
    assert detail["steps"][0]["attempts"] == 1 and detail["steps"][0]["duration_ms"] is not None
    assert [(e["step"], e["event"]) for e in detail["events"]] == [("answer", "start"), ("answer", "done")]
    assert detail["events"][0]["at"] <= detail["events"][1]["at"] == detail["steps"][0]["finished_at"]
    assert detail["result"] == {"seq": detail["case_file"]["done"]["answer"]["seq"], "words": 2}
    assert detail["effects"] == [] and detail["task"]["params"]["question"] == "ping"
    assert api.call("POST", f"/v1/tasks/{done_id}/cancel")[0] == 409  # it ended already
    # A task held inside its step: cancel, then let the step finish: the task stays cancelled.
    hold = tmp_path / "hold"
    hold.write_text("1")
    held = str(uuid.uuid4())
    api.call("POST", "/v1/tasks", {"id": held, "kind": "holder", "params": {"hold_file": str(hold)}})
    while api.call("GET", f"/v1/tasks/{held}")[1]["task"]["status"] != "running":
        time.sleep(0.05)
    status, body = api.call("POST", f"/v1/tasks/{held}/cancel")
    assert status == 200 and body["task"]["status"] == "cancelled"
    hold.unlink()
    time.sleep(1.0)
    detail = api.call("GET", f"/v1/tasks/{held}")[1]
    assert detail["task"]["status"] == "cancelled"
    assert [s["status"] for s in detail["steps"]][1:] == ["pending"] * (len(detail["steps"]) - 1)
    listed = api.call("GET", "/v1/tasks?limit=1")[1]
    assert listed["tasks"][0]["id"] == held and listed["next"] == held
    assert api.call("GET", f"/v1/tasks?before={held}")[1]["tasks"][0]["id"] == done_id
    assert [t["id"] for t in api.call("GET", "/v1/tasks?status=cancelled")[1]["tasks"]] == [held]


@pytest.mark.parametrize("decision", ["performed", "not_performed"])
def test_a_human_decides_an_effect_in_doubt(decision: str, tenant_db: TenantDB, tmp_path: Path,
                                             hosts: HostRunner) -> None:
    env = api_env(tenant_db, tmp_path, AGENT_SMTP_URL="smtp://127.0.0.1:9")
    tid, key = plant_blocked_email(env)
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    open_ = api.call("GET", "/v1/effects")[1]["effects"]
    assert [(e["key"], e["state"], e["task"]) for e in open_] == [(key, "blocked", tid)]
    status, body = api.call("POST", f"/v1/effects/{key}/decision",
                            {"decision": decision, "result": {"message_id": "<m1@relay>", "refused": []},
                             "decided_by": "ops@example"})
    assert status == 200, body
    assert body["effect"]["state"] == ("committed" if decision == "performed" else "failed")
    assert api.call("POST", f"/v1/effects/{key}/decision", {"decision": decision})[0] == 409  # settled
    want = "done" if decision == "performed" else "blocked"
    deadline = time.monotonic() + 15
    while (detail := api.call("GET", f"/v1/tasks/{tid}")[1])["task"]["status"] != want:
        assert time.monotonic() < deadline, detail
        time.sleep(0.05)
    if decision == "performed":
        assert detail["result"] == ["<m1@relay>"]  # the step continued with the human's answer; nothing sent
    else:
        assert detail["task"]["blocked_reason"] == "effect_failed"
    assert count(tenant_db, "SELECT count(*) FROM effects") == 1


def test_no_decision_for_a_cancelled_tasks_effect(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    env = api_env(tenant_db, tmp_path, AGENT_SMTP_URL="smtp://127.0.0.1:9")
    tid, key = plant_blocked_email(env)
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    assert api.call("POST", f"/v1/tasks/{tid}/cancel")[0] == 200
    status, problem = api.call("POST", f"/v1/effects/{key}/decision", {"decision": "perform_now"})
    assert status == 409 and "cancelled" in problem["detail"]
    assert api.call("GET", "/v1/effects?state=blocked")[1]["effects"][0]["key"] == key  # left as it was


def test_events_and_logs(api: Client) -> None:
    mid = str(uuid.uuid4())
    api.call("POST", "/v1/threads/ev/messages", {"id": mid, "content": "hello"})
    api.events(f"/v1/threads/ev/messages/{mid}/reply")
    events = api.events("/v1/events?after=s0-h0", until="step")
    assert events[0] == ("host", {"kind": "boot", "at": events[0][1]["at"]})
    assert events[-1][0] == "step" and events[-1][1]["task"] == mid and events[-1][1]["event"] == "start"
    status, logs = api.call("GET", "/v1/logs?limit=50")
    assert status == 200 and any(r.get("event") == "ready" for r in logs["records"])
    errors = api.call("GET", "/v1/logs?level=error")[1]["records"]
    assert all(r.get("level") in ("error", "critical") for r in errors)
    token = api.env["AGENT_INSTANCE_TOKEN"]
    assert token not in json.dumps(logs)


def test_sigkill_while_the_reply_is_produced(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    """The reply stream breaks with the instance; after the restart the same message is answered, once."""
    hold = tmp_path / "hold"
    env = api_env(tenant_db, tmp_path, AGENT_CONFIG=json.dumps({"chat_hold_file": str(hold)}))
    hold.write_text("1")
    first = hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    mid = str(uuid.uuid4())
    assert api.call("POST", "/v1/threads/k/messages", {"id": mid, "content": "are you there"})[0] == 201
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=20)
    path = f"/v1/threads/k/messages/{mid}/reply"
    c.request("GET", path, headers={"Authorization": sign(env["AGENT_INSTANCE_TOKEN"], env["AGENT_TENANT_ID"],
                                                          "GET", path, b"")})
    resp = c.getresponse()
    seen = b""
    while b"event: delta" not in seen:
        seen += resp.fp.readline()
    first.kill()
    first.wait()
    rest = resp.fp.read()  # the stream ends with the process
    assert b"event: reply" not in rest
    c.close()
    hold.unlink()
    hosts.start(env)
    hosts.wait_ready(env)
    events = api.events(path)
    assert [e for e, _ in events][-2:] == ["reply", "end"]
    assert events[-2][1]["content"] == "echo: are you there"
    assert count(tenant_db, "SELECT count(*) FROM messages WHERE thread = 'k' AND role = 'user'") == 1
    assert count(tenant_db, "SELECT count(*) FROM messages WHERE thread = 'k' AND role = 'assistant'") == 1


def test_a_host_without_a_token_has_no_open_api(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP)
    env.pop("AGENT_INSTANCE_TOKEN", None)
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    assert api.call("GET", "/v1/tasks", auth=sign("", env["AGENT_TENANT_ID"], "GET", "/v1/tasks", b""))[0] == 401
    assert api.call("GET", "/v1/tasks", auth=None)[0] == 401
    assert os.environ.get("AGENT_INSTANCE_TOKEN") is None


def test_a_messages_policy_is_applied_by_the_instance_once(tenant_db: TenantDB, tmp_path: Path,
                                                           hosts: HostRunner) -> None:
    """The instance's own decision (what settles two senders racing, and the only one while the control plane could
    not ask): `reject` is a 409 naming the running task and stores nothing; `interrupt` ends that run, and a
    re-delivery of the same message applies nothing again."""
    hold = tmp_path / "hold"
    env = api_env(tenant_db, tmp_path, AGENT_CONFIG=json.dumps({"chat_hold_file": str(hold)}))
    hold.write_text("1")
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    first, second, third = (str(uuid.uuid4()) for _ in range(3))
    assert api.call("GET", "/v1/threads/k/run") == (200, {"task": None})
    assert api.call("POST", "/v1/threads/k/messages", {"id": first, "content": "take your time"})[0] == 201
    wait_status(tenant_db, first, ("running",))
    status, running = api.call("GET", "/v1/threads/k/run")
    assert status == 200 and running["task"]["id"] == first and running["task"]["status"] == "running"

    status, problem = api.call("POST", "/v1/threads/k/messages", {"id": second, "content": "now", "policy": "reject"})
    assert (status, problem["code"], problem["task"]) == (409, "thread_busy", {"id": first, "status": "running"})
    assert api.call("POST", "/v1/threads/k/messages", {"id": second, "content": "now", "policy": "soon"})[0] == 400
    assert count(tenant_db, "SELECT count(*) FROM tasks WHERE id = %s", second) == 0
    assert count(tenant_db, "SELECT count(*) FROM messages WHERE thread = 'k'") == 1

    body = {"id": third, "content": "stop that", "policy": "interrupt"}
    status, answer = api.call("POST", "/v1/threads/k/messages", body)
    assert status == 201 and answer["halted"] == [{"id": first, "status": "interrupted"}]
    status, again = api.call("POST", "/v1/threads/k/messages", body)  # a re-delivery: nothing applied twice
    assert status == 200 and again["halted"] == []
    hold.unlink()
    assert wait_status(tenant_db, third, ("done",)) == "done"
    assert count(tenant_db, "SELECT count(*) FROM tasks WHERE id = %s AND status = 'interrupted'", first) == 1
    assert api.events(f"/v1/threads/k/messages/{first}/reply")[-1] == ("end", {"status": "interrupted"})
    assert api.call("GET", "/v1/threads/k/run") == (200, {"task": None})
