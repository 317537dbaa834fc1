"""ctx.config is asked per task and recorded with it (issue 32): a replay after a crash keeps the values the task
started with, the next task gets the current ones, and a task whose configuration cannot be had waits (it never
runs on a guess). In-process run_task on a real tenant schema; the source is a plain object whose answer changes."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.effects.config import adapter_from_spec
from agent_runtime.host.agent_config import ConfigUnavailable
from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.host.loader import load_agents
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent
from agent_runtime.state import tasks
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from tests.docblocks import doc_blocks, write_titled_blocks

from .conftest import ROOT


class ChangingSource:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.down = False
        self.asked = 0

    def fetch(self) -> dict[str, Any]:
        self.asked += 1
        if self.down:
            raise ConfigUnavailable("agent configuration unavailable: URLError")
        return dict(self.config)


def _runtime(conn: psycopg.Connection, tmp_path: Path, source: ChangingSource,
             base: dict[str, Any] | None = None) -> Runtime:
    tenant_id = str(uuid.uuid4())
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), tenant_id)
    (tmp_path / "volume").mkdir(mode=0o700, exist_ok=True)
    return Runtime(conn=conn, tenant_id=tenant_id, volume=tmp_path / "volume", store=store,
                   credentials=InMemoryCredentialSource({"refund-api": "s3cret"}), config_source=source,
                   agent_config=dict(base or {}))


def _agent(seen: list[dict[str, Any]], crash_once: list[bool]) -> Agent:
    agent = Agent("configured")

    @agent.step
    def first(ctx):  # type: ignore[no-untyped-def]
        seen.append({"step": "first", **ctx.config})
        return True

    @agent.step
    def second(ctx):  # type: ignore[no-untyped-def]
        seen.append({"step": "second", **ctx.config})
        if crash_once:
            crash_once.pop()
            raise RuntimeError("the instance died here")
        return {"key": ctx.config_credential("api_key").version}

    return agent


def test_a_replayed_task_keeps_its_configuration_and_the_next_task_gets_the_new_one(
        conn: psycopg.Connection, tmp_path: Path) -> None:
    source = ChangingSource({"limit": 1, "api_key": "refund-api"})
    rt = _runtime(conn, tmp_path, source)
    seen: list[dict[str, Any]] = []
    agent = _agent(seen, crash_once=[True])
    task = tasks.submit(conn, "configured", {})
    assert run_task(rt, agent, task) == "retry"
    source.config = {"limit": 2, "api_key": "refund-api"}  # the operator changes it while the task is under way
    assert run_task(rt, agent, task) == "done"
    assert [s["limit"] for s in seen] == [1, 1, 1], seen  # first, second (crashed), second again: all on v1
    assert source.asked == 1

    seen.clear()
    later = tasks.submit(conn, "configured", {})
    assert run_task(rt, agent, later) == "done"
    assert [s["limit"] for s in seen] == [2, 2]
    recorded = dict(conn.execute("SELECT id, agent_config->>'limit' FROM tasks").fetchall())
    assert recorded == {task: "1", later: "2"}


def test_a_task_waits_while_its_configuration_cannot_be_had(conn: psycopg.Connection, tmp_path: Path) -> None:
    source = ChangingSource({"limit": 3, "api_key": "refund-api"})
    source.down = True
    rt = _runtime(conn, tmp_path, source)
    seen: list[dict[str, Any]] = []
    agent = _agent(seen, crash_once=[])
    task = tasks.submit(conn, "configured", {})
    assert run_task(rt, agent, task) == "retry"
    assert seen == [] and conn.execute("SELECT agent_config FROM tasks").fetchone() == (None,)
    source.down = False
    assert run_task(rt, agent, task) == "done"
    assert [s["limit"] for s in seen] == [3, 3]


def test_the_sdk_pages_configured_agent_runs_with_its_configuration(conn: psycopg.Connection, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/sdk.md, "Configuration with a schema": its agent, loaded as written, reads ctx.config and the credential
    its configuration names."""
    write_titled_blocks(doc_blocks(ROOT / "docs" / "sdk.md"), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "reference"))
    agent = load_agents("refund_agent:agent").agents["refunds"]
    assert agent.config_schema["properties"]["payments_key"] == {"type": "string", "format": "credential"}
    source = ChangingSource({"max_refund": 40, "payments_key": "refund-api"})
    rt = _runtime(conn, tmp_path, source)
    task = tasks.submit(conn, "refunds", {"amount": 100})
    assert run_task(rt, agent, task) == "done"
    done = conn.execute("SELECT value FROM case_entries WHERE task_id = %s AND kind = 'done'", (task,)).fetchone()
    assert done is not None and done[0] == {"refund": 40, "currency": "EUR", "key_version": 1}


def test_the_instances_agent_config_is_the_base_under_the_control_planes_answer(
        conn: psycopg.Connection, tmp_path: Path) -> None:
    source = ChangingSource({"limit": 5, "api_key": "refund-api"})
    rt = _runtime(conn, tmp_path, source, base={"limit": 0, "chat_hold_file": "/tmp/x"})
    seen: list[dict[str, Any]] = []
    assert run_task(rt, _agent(seen, crash_once=[]), tasks.submit(conn, "configured", {})) == "done"
    assert seen[0] == {"step": "first", "limit": 5, "api_key": "refund-api", "chat_hold_file": "/tmp/x"}


class Provider:
    """A fake HTTP provider: records each request's path, Idempotency-Key and body, answers with a charge id."""

    def __init__(self, name: str) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                provider.requests.append((self.path, self.headers.get("Idempotency-Key", ""), body))
                answer = json.dumps({"id": f"{name}_{len(provider.requests)}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def providers() -> Iterator[tuple[Provider, Provider, Provider]]:
    made = (Provider("instance"), Provider("acme"), Provider("globex"))
    try:
        yield made
    finally:
        for p in made:
            p.close()


def _payer() -> Agent:
    agent = Agent("payer")

    @agent.step
    def pay(ctx):  # type: ignore[no-untyped-def]
        return ctx.effect("payment", {"amount": ctx.params["amount"]})

    return agent


def test_each_tasks_configuration_names_its_own_http_provider(
        conn: psycopg.Connection, tmp_path: Path, providers: tuple[Provider, Provider, Provider]) -> None:
    """Issue 32: the `effects` of a task's recorded configuration replace the instance's provider of that name for
    that task only, so two customers' configurations send to two providers, each with the ledger's key."""
    instance, acme, globex = providers
    source = ChangingSource({"effects": {"payment": {"type": "http", "url": f"{acme.url}/acme/charges"}}})
    rt = _runtime(conn, tmp_path, source)
    rt.effects = {"payment": adapter_from_spec("payment", {"type": "http", "url": f"{instance.url}/env"}, None)}
    agent = _payer()
    first = tasks.submit(conn, "payer", {"amount": 10})
    assert run_task(rt, agent, first) == "done"
    source.config = {"effects": {"payment": {"type": "http", "url": f"{globex.url}/globex/charges"}}}
    second = tasks.submit(conn, "payer", {"amount": 20})
    assert run_task(rt, agent, second) == "done"
    source.config = {}
    third = tasks.submit(conn, "payer", {"amount": 30})
    assert run_task(rt, agent, third) == "done"

    assert acme.requests == [("/acme/charges", rt.ledger.key_for(first, "pay", "payment"), {"amount": 10})]
    assert globex.requests == [("/globex/charges", rt.ledger.key_for(second, "pay", "payment"), {"amount": 20})]
    assert instance.requests == [("/env", rt.ledger.key_for(third, "pay", "payment"), {"amount": 30})]


def test_the_agent_packages_own_effects_win_and_an_invalid_spec_blocks_the_task(
        conn: psycopg.Connection, tmp_path: Path, providers: tuple[Provider, Provider, Provider]) -> None:
    own, configured, _ = providers
    source = ChangingSource({"effects": {"payment": {"type": "http", "url": f"{configured.url}/cfg"}}})
    rt = _runtime(conn, tmp_path, source)
    agent = _payer()
    agent.effects = {"payment": adapter_from_spec("payment", {"type": "http", "url": f"{own.url}/own"}, None)}
    task = tasks.submit(conn, "payer", {"amount": 5})
    assert run_task(rt, agent, task) == "done"
    assert [r[0] for r in own.requests] == ["/own"] and configured.requests == []

    source.config = {"effects": {"payment": {"type": "http"}}}  # no url
    bad = tasks.submit(conn, "payer", {"amount": 6})
    assert run_task(rt, _payer(), bad) == "blocked"
    row = tasks.get(conn, bad)
    assert row is not None and row.blocked_reason == "effects_config_invalid" and "'url' is required" in (
        row.blocked_detail or "")
    assert len(own.requests) == 1 and configured.requests == []
