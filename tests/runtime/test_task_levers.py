"""Levers on a stuck task, against real agent-host processes through the signed instance API: a poison task
retried after its cause is removed finishes with each effect once and no finished step re-run; a retry of a task
in any other state is 409; a step's error names the agent's own file and line; a credential the vault does not
hold (in a step or inside an effect adapter) blocks the task with `credential_unavailable`, and storing it
resumes the task by itself within one heartbeat."""

from __future__ import annotations

import inspect
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.db import connect

from . import agents
from .conftest import HostRunner, Sinks, TenantDB
from .test_host import wait_status
from .test_instance_api import Client, api_env


def _row(t: TenantDB, task_id: str) -> tuple[Any, ...]:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        row = c.execute("SELECT status, blocked_reason, blocked_detail, blocked_credential FROM tasks WHERE id = %s",
                        (task_id,)).fetchone()
    assert row is not None
    return tuple(row)


def _events(t: TenantDB, task_id: str) -> list[tuple[str, str]]:
    with connect(t.dsn, t.schema, autocommit=True) as c:
        return [(r[0], r[1]) for r in c.execute(
            "SELECT step, event FROM step_events WHERE task_id = %s ORDER BY id", (task_id,))]


def _submit(api: Client, kind: str, params: dict[str, Any]) -> str:
    task_id = str(uuid.uuid4())
    status, body = api.call("POST", "/v1/tasks", {"id": task_id, "kind": kind, "params": params})
    assert status in (200, 201), body
    return task_id


def test_a_poison_task_retried_after_its_cause_is_removed_finishes_with_each_effect_once(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner, sinks: Sinks) -> None:
    env = api_env(tenant_db, tmp_path, AGENT_SMTP_URL=sinks.smtp_url)
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    fixed = tmp_path / "fixed"
    task_id = _submit(api, "fixable", {"fixed_file": str(fixed)})
    assert wait_status(tenant_db, task_id, ("blocked", "done")) == "blocked"
    status, reason, detail, _ = _row(tenant_db, task_id)
    # The error names the agent's own frame (not the runtime's), relative to its package: no host path.
    source, first = inspect.getsourcelines(agents.charge)
    line = first + next(i for i, text in enumerate(source) if "amount, currency = values" in text)
    where = f"(tests/runtime/agents.py:{line} in charge)"
    assert reason == "poison_step" and "ValueError: too many values to unpack" in detail and where in detail, detail
    assert str(tmp_path) not in detail and "/work" not in detail
    # ... stored with the step's event and shown in the task detail.
    code, body = api.call("GET", f"/v1/tasks/{task_id}")
    assert code == 200
    charge = next(s for s in body["steps"] if s["name"] == "charge")
    assert charge["status"] == "failed" and where in charge["error"] and charge["attempts"] == 2
    assert [e["error"] for e in body["events"] if e["event"] == "failed"][-1].endswith(where)
    assert len(sinks.emails()) == 1

    # A retry before the fix: the attempt count starts again (two more tries), then poison again.
    code, body = api.call("POST", f"/v1/tasks/{task_id}/retry")
    assert code == 200 and body["task"]["status"] == "pending", body
    deadline = time.monotonic() + 20
    while _events(tenant_db, task_id).count(("charge", "failed")) < 4:
        assert time.monotonic() < deadline, _events(tenant_db, task_id)
        time.sleep(0.05)
    assert wait_status(tenant_db, task_id, ("blocked",)) == "blocked"
    assert _row(tenant_db, task_id)[1] == "poison_step"

    fixed.touch()  # the cause is removed
    assert api.call("POST", f"/v1/tasks/{task_id}/retry")[0] == 200
    assert wait_status(tenant_db, task_id, ("done", "blocked")) == "done"
    events = _events(tenant_db, task_id)
    assert events.count(("notify_first", "start")) == 1  # the step done before the poison is never run again
    assert events.count(("", "retried")) == 2 and events[-2:] == [("close", "start"), ("close", "done")]
    assert len(sinks.emails()) == 1  # the email went out once, whatever the retries
    code, body = api.call("GET", f"/v1/tasks/{task_id}")
    assert body["result"] == "closed" and body["case_file"]["done"]["charge"] == {"amount": 1, "currency": 2}

    # A done task is not retried; neither is a task that does not exist.
    code, problem = api.call("POST", f"/v1/tasks/{task_id}/retry")
    assert (code, problem["code"]) == (409, "conflict") and "done" in problem["detail"]
    assert api.call("POST", f"/v1/tasks/{uuid.uuid4()}/retry")[0] == 404


class FakeControlPlane:
    """The control plane's internal API as the instance sees it: credentials from a dict (404 when absent, as the
    vault answers), an empty agent configuration, heartbeats counted, and a provider endpoint that records each
    Idempotency-Key it is called with."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.credentials: dict[str, tuple[int, str]] = {}
        self.credential_asks: list[str] = []  # GETs: reads of the value
        self.credential_checks: list[str] = []  # HEADs: the host asking whether it is there yet
        self.heartbeats = 0
        self.charges: list[str] = []
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_HEAD(self) -> None:  # noqa: N802 - "is it there?": never the value, never consumed
                prefix = "/internal/v1/credentials/"
                if not self.path.startswith(prefix) or self.headers.get("Authorization") != f"Bearer {plane.token}":
                    return self._send(404, {})
                plane.credential_checks.append(self.path[len(prefix):])
                self.send_response(204 if self.path[len(prefix):] in plane.credentials else 404)
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                prefix = "/internal/v1/credentials/"
                if self.path == "/internal/v1/agent-config":  # asked when each task starts: no configuration
                    return self._send(200, {"config": {}})
                if not self.path.startswith(prefix) or self.headers.get("Authorization") != f"Bearer {plane.token}":
                    return self._send(404, {"detail": "not found"})
                name = self.path[len(prefix):]
                plane.credential_asks.append(name)
                if name not in plane.credentials:
                    return self._send(404, {"detail": "no such credential"})
                version, value = plane.credentials[name]
                return self._send(200, {"name": name, "version": version, "value": value})

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/internal/v1/heartbeat":
                    plane.heartbeats += 1
                    return self._send(200, {})
                if self.path == "/provider/charges":
                    if self.headers.get("Authorization") != "Bearer pay-secret-1":
                        return self._send(401, {"detail": "bad key"})
                    plane.charges.append(self.headers.get("Idempotency-Key", ""))
                    return self._send(200, {"id": f"ch_{len(plane.charges)}"})
                return self._send(404, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plane() -> Any:
    p = FakeControlPlane(token=uuid.uuid4().hex)
    yield p
    p.stop()


def _wait_row(t: TenantDB, task_id: str, status: str, timeout: float = 20, credential: str | None = None
              ) -> tuple[Any, ...]:
    deadline = time.monotonic() + timeout
    while (row := _row(t, task_id))[0] != status or (credential is not None and row[3] != credential):
        assert time.monotonic() < deadline, row
        time.sleep(0.02)
    return row


def test_a_missing_credential_blocks_with_its_name_and_storing_it_resumes_the_task_within_a_heartbeat(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner, plane: FakeControlPlane) -> None:
    heartbeat_s = 1.0
    effects = {"pay": {"type": "http", "url": plane.url + "/provider/charges", "bearer_credential": "payments"}}
    env = api_env(tenant_db, tmp_path, AGENT_CONTROL_PLANE_URL=plane.url, AGENT_HEARTBEAT_INTERVAL_S=str(heartbeat_s),
                  AGENT_EFFECTS=json.dumps(effects))
    env["AGENT_INSTANCE_TOKEN"] = plane.token
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    task_id = _submit(api, "keyed", {})

    # In a step: blocked (not running forever), the reason and the credential's name, never a value.
    status, reason, detail, credential = _wait_row(tenant_db, task_id, "blocked")
    assert (reason, credential) == ("credential_unavailable", "openai") and "'openai'" in detail, detail
    code, body = api.call("GET", "/v1/tasks?status=blocked")
    assert [t["blocked_reason"] for t in body["tasks"] if t["id"] == task_id] == ["credential_unavailable"]
    time.sleep(2 * heartbeat_s)  # still blocked while the vault does not hold it; the wait is not a poison attempt
    assert _row(tenant_db, task_id)[0] == "blocked"
    checks = len(plane.credential_checks)
    assert 1 <= checks <= 4, plane.credential_checks  # re-checked about once per heartbeat, not in a tight loop
    assert plane.credential_asks == ["openai"]  # the value was read once, by the step; the checks read nothing

    plane.credentials["openai"] = (1, "sk-test-value")
    stored_at = time.monotonic()
    # Inside an effect adapter (the next step's HTTP effect reads "payments"): blocked the same way, not in doubt.
    status, reason, detail, credential = _wait_row(tenant_db, task_id, "blocked", timeout=heartbeat_s + 5,
                                                   credential="payments")
    resumed_in = time.monotonic() - stored_at
    assert (reason, credential) == ("credential_unavailable", "payments"), detail
    assert resumed_in < heartbeat_s + 1.5, resumed_in  # one heartbeat, plus the time to run a step
    assert plane.charges == []  # nothing was sent without the key
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        assert c.execute("SELECT state, resolution FROM effects").fetchall() == [("intent", "unreached")]

    plane.credentials["payments"] = (1, "pay-secret-1")
    assert _wait_row(tenant_db, task_id, "done", timeout=heartbeat_s + 5)[0] == "done"
    assert len(plane.charges) == 1  # performed once, with its key, after the credential arrived
    events = _events(tenant_db, task_id)
    assert ("ask_model", "failed") not in events and ("pay", "failed") not in events  # waits, not attempts
    assert events.count(("ask_model", "done")) == 1
    code, body = api.call("GET", f"/v1/tasks/{task_id}")
    waits = [e.get("error", "") for e in body["events"] if e["event"] == "waiting"]
    assert any("'openai'" in w for w in waits) and any("'payments'" in w for w in waits)
    assert not any("sk-test-value" in w or "pay-secret-1" in w for w in waits)
    assert "sk-test-value" not in json.dumps(body) and "pay-secret-1" not in json.dumps(body)
