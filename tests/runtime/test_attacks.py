"""The three rollback attacks from the checkpoint/rollback security study, each blocked."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from agent_examples.demo import MALWARE_MARKER, DemoAgent

from agent_runtime.db import connect
from agent_runtime.errors import RestoreRefused
from agent_runtime.host.runner import Runtime, restore_checkpoint, run_task, task_workdir
from agent_runtime.sdk import Context, Step
from agent_runtime.state import tasks
from agent_runtime.state.workspace import restore_snapshot, snapshot, tree_digest

from .conftest import HostRunner, Sinks, TenantDB, payment_adapter, start_sinks


class ReleaseAgent:
    """fetch (infected) -> clean -> scan -> release: the coding-agent scenario."""

    kind = "release"

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return [Step("fetch", self.fetch), Step("clean", self.clean), Step("scan", self.scan),
                Step("release", self.release)]

    def fetch(self, ctx: Context) -> Any:
        (ctx.workdir / "main.py").write_text("print('hello')\n")
        (ctx.workdir / "backdoor.py").write_text(MALWARE_MARKER)
        key, digest = snapshot(ctx.rt.conn, ctx.rt.store, ctx.workdir, scope=f"pre-clean/{ctx.task.id}")
        ctx.delta.notes["pre_clean_snapshot"] = [key, digest]
        return True

    def clean(self, ctx: Context) -> Any:
        (ctx.workdir / "backdoor.py").unlink(missing_ok=True)
        return True

    def scan(self, ctx: Context) -> Any:
        infected = [p.name for p in ctx.workdir.iterdir() if MALWARE_MARKER in p.read_text()]
        ctx.judge("scan", passed=not infected)
        if ctx.params.get("stop_after_scan"):
            ctx.rt.stop_event.set()
        return {"infected": infected}

    def release(self, ctx: Context) -> Any:
        ctx.require_judgment("scan")
        return ctx.effect("email", {"from": "a@t", "to": "pypi@t", "subject": "release", "body": "v1"})


@pytest.mark.parametrize("policy", ["refuse", "fork"])
def test_a_scan_judgment_not_reattached_to_rolled_back_workspace(runtime: Runtime, sinks: Sinks, policy: str) -> None:
    rt = runtime
    agent = ReleaseAgent()
    tid = tasks.submit(rt.conn, "release", {"stop_after_scan": True})
    assert run_task(rt, agent, tid) == "stopped"
    assert rt.judgments.require("scan", f"workspace:{tid}", tree_digest(task_workdir(rt, tid)))
    # The rollback: the workspace comes back from before the cleanup; the "passed" judgment survives.
    case = rt.checkpoints.case_file(rt.checkpoints.latest(tid))
    key, digest = case.notes["pre_clean_snapshot"]
    restore_snapshot(rt.store, key, task_workdir(rt, tid), digest)
    assert (task_workdir(rt, tid) / "backdoor.py").exists()
    rt.stop_event.clear()
    rt.on_workspace_mismatch = policy
    outcome = run_task(rt, agent, tid)
    task = tasks.get(rt.conn, tid)
    assert outcome == "blocked" and task is not None
    assert task.blocked_reason == ("workspace_mismatch" if policy == "refuse" else "judgment_invalid")
    assert sinks.emails() == []  # nothing was released
    if policy == "fork":
        assert rt.conn.execute("SELECT count(*) FROM branches WHERE task_id = %s", (tid,)).fetchone()[0] == 1


def test_c_no_double_payment_with_regenerated_arguments(runtime: Runtime, tmp_path: Path) -> None:
    rt = runtime
    nodedupe = start_sinks(tmp_path / "nodedupe", dedupe=False)  # the provider would charge twice
    try:
        rt.effects["payment"] = payment_adapter(nodedupe.payments_url)
        tid = tasks.submit(rt.conn, "demo", {"regenerate_args": True, "amount": 5000})
        assert run_task(rt, DemoAgent(), tid) == "done"
        assert nodedupe.payment_stats()["charges"] == 1
        before_pay = next(cp for cp in rt.checkpoints.list(tid) if cp.step == "send_email")
        with pytest.raises(RestoreRefused, match="effect ledger"):
            restore_checkpoint(rt, before_pay)
        restore_checkpoint(rt, before_pay, fork=True, reason="operator rollback")
        assert tasks.get(rt.conn, tid).status == "pending"
        assert run_task(rt, DemoAgent(), tid) == "done"  # pay step re-ran with fresh arguments...
        stats = nodedupe.payment_stats()
        assert stats["charges"] == 1 and stats["posts"] == 1  # ...and the provider was not called again
        assert rt.ledger.count(tid) == 2  # one email, one payment
    finally:
        nodedupe.stop()


class ControlPlaneStub:
    """A local stand-in for the control plane's internal API: credentials, heartbeats, and the agent configuration
    each task asks for when it starts (none here: ``{"config": {}}``, as the control plane answers)."""

    def __init__(self, token: str, credentials: dict[str, str]) -> None:
        self.token = token
        self.credentials = dict(credentials)
        self.heartbeats: list[dict[str, Any]] = []
        self.credential_requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return

            def _auth(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {stub.token}":
                    self.send_response(401)
                    self.end_headers()
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._auth():
                    return
                if self.path == "/internal/v1/agent-config":
                    self._json({"config": {}})
                    return
                name = self.path.rsplit("/", 1)[-1]
                stub.credential_requests.append(name)
                if name not in stub.credentials:
                    self.send_response(404)
                    self.end_headers()
                    return
                self._json({"name": name, "version": 1, "value": stub.credentials[name]})

            def _json(self, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                if not self._auth():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.heartbeats.append(body)
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def control_plane() -> Iterator[ControlPlaneStub]:
    stub = ControlPlaneStub("inst-token-123", {"mail-forwarding": "fwd-secret-value", "smtp": "smtp-secret"})
    yield stub
    stub.close()


def test_b_revoked_forwarding_not_resurrected_by_rollback(tenant_db: TenantDB, host_env: dict, hosts: HostRunner,
                                                          sinks: Sinks, control_plane: ControlPlaneStub) -> None:
    env = {**host_env, "AGENT_SMTP_URL": sinks.smtp_url, "AGENT_CONTROL_PLANE_URL": control_plane.url,
           "AGENT_INSTANCE_TOKEN": control_plane.token, "AGENT_HEARTBEAT_INTERVAL_S": "0.1"}
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        hosts.start(env)
        hosts.wait_ready(env)
        tid = tasks.submit(c, "forward", {"forward_to": "attacker@evil.test", "wait_s": 30})
        deadline = time.monotonic() + 15
        while not c.execute("SELECT 1 FROM checkpoints WHERE task_id = %s AND step = 'enable'", (tid,)).fetchone():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "mail-forwarding" in control_plane.credential_requests
        time.sleep(0.3)
        hosts.procs[-1].kill(signal.SIGKILL)
        hosts.procs[-1].wait()
        # The user revokes forwarding; the checkpoint (taken while it was allowed) still says "enabled".
        del control_plane.credentials["mail-forwarding"]
        c.execute("UPDATE tasks SET params = params || '{\"wait_s\": 0}' WHERE id = %s", (tid,))
        hosts.start(env)
        deadline = time.monotonic() + 15
        while (status := c.execute("SELECT status, blocked_reason FROM tasks WHERE id = %s", (tid,)).fetchone())[0] \
                not in ("blocked", "done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert status == ("blocked", "credential_unavailable")
    assert sinks.emails() == []
    assert control_plane.heartbeats and all(isinstance(h["progress_seq"], int) for h in control_plane.heartbeats)
    assert any(h["task"] == str(tid) and h["step"] == "wait" for h in control_plane.heartbeats)
    for proc in hosts.procs:
        assert "fwd-secret-value" not in proc.output() and "inst-token-123" not in proc.output()
