"""Traces kept in the tenant's schema (`state.traces`, docs/observability.md): a task over its span cap keeps its
run and step spans and its newest calls, old spans are pruned, and a tool's secret-named arguments and results are
redacted before they are stored. In process, with a tracer provider of the test's own feeding the same
`TaskSpanBuffer` the host uses."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider

from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.host.tracing import TASK_SPANS
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from agent_runtime.state.traces import spans_prune, spans_write, task_spans


@pytest.fixture
def traced(conn: psycopg.Connection, tmp_path: Path) -> Runtime:
    provider = TracerProvider()
    provider.add_span_processor(TASK_SPANS)
    tenant_id = str(uuid.uuid4())
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), tenant_id)
    (tmp_path / "volume").mkdir(mode=0o700)
    return Runtime(conn=conn, tenant_id=tenant_id, volume=tmp_path / "volume", store=store,
                   credentials=InMemoryCredentialSource({}), tracer=provider.get_tracer("test"),
                   trace_spans_per_task=10)


def test_a_task_over_its_cap_keeps_its_run_its_steps_and_its_newest_calls(traced: Runtime) -> None:
    agent = Agent("looper")

    @agent.step
    def plan(ctx: Context) -> int:
        return 1

    @agent.step
    def loop(ctx: Context) -> int:
        for i in range(30):
            ctx.tool("count", {"i": i}, lambda i=i: i)  # type: ignore[misc]
        return 30

    tid = tasks.submit(traced.conn, "looper", {})
    assert run_task(traced, agent, tid) == "done"
    names = [s["name"] for s in task_spans(traced.conn, tid)]
    assert len(names) == 10
    assert {"invoke_agent looper", "step plan", "step loop"} <= set(names)
    kept = [s for s in task_spans(traced.conn, tid) if s["name"] == "execute_tool count"]
    assert sorted(int(s["attributes"]["gen_ai.tool.call.result"]) for s in kept) == list(range(23, 30))
    run = next(s for s in task_spans(traced.conn, tid) if s["name"] == "invoke_agent looper")
    assert run["parent_span_id"] is None and run["attributes"]["agent.outcome"] == "done"
    assert all(s["trace_id"] == run["trace_id"] for s in task_spans(traced.conn, tid))


def test_secret_named_fields_of_a_tool_call_are_redacted_before_they_are_stored(traced: Runtime) -> None:
    agent = Agent("secretive")

    @agent.step
    def call(ctx: Context) -> str:
        ctx.tool("crm", {"customer": "ada", "api_key": "sk-live-123", "auth": {"password": "hunter2"}},
                 lambda: {"name": "Ada", "access_token": "tok-456"})
        return "ok"

    tid = tasks.submit(traced.conn, "secretive", {})
    assert run_task(traced, agent, tid) == "done"
    [tool] = [s for s in task_spans(traced.conn, tid) if s["name"] == "execute_tool crm"]
    stored = str(tool["attributes"])
    assert "sk-live-123" not in stored and "hunter2" not in stored and "tok-456" not in stored
    assert '"customer": "ada"' in tool["attributes"]["gen_ai.tool.call.arguments"]
    assert '"api_key": "[redacted]"' in tool["attributes"]["gen_ai.tool.call.arguments"]
    assert '"name": "Ada"' in tool["attributes"]["gen_ai.tool.call.result"]


def test_spans_older_than_the_retention_are_pruned(conn: psycopg.Connection) -> None:
    task = uuid.uuid4()
    now = datetime.now(UTC)

    def row(span: str, age_days: float) -> dict[str, object]:
        return {"task_id": task, "trace_id": "a" * 32, "span_id": span, "parent_span_id": None,
                "name": f"step {span}", "kind": "internal", "status": "unset",
                "started_at": now - timedelta(days=age_days), "duration_ms": 1.0, "attributes": {}}

    assert spans_write(conn, [row("0" * 16, 40), row("1" * 16, 1)], max_per_task=500) == 2
    assert spans_write(conn, [row("1" * 16, 1)], max_per_task=500) == 0  # a span seen twice is stored once
    assert spans_prune(conn, older_than=now - timedelta(days=30)) == 1
    assert [s["span_id"] for s in task_spans(conn, task)] == ["1" * 16]
