"""Traces: the OpenTelemetry spans of a task's runs, named by the GenAI semantic conventions (docs/observability.md).

One trace per run of a task: `invoke_agent <kind>` (the run), `step <name>` under it (with the checkpoint the step
wrote), and under a step `execute_tool <name>` (`ctx.tool`, MCP tools), `chat <model>` (`ChatModel`, or a bare
`ctx.usage` report) and `effect <name>` (the ledger: idempotency key and outcome). The spans go two ways:
- to the tenant's schema (`state.traces`), through `TaskSpanBuffer`: a span processor that keeps finished spans
  in memory by task until the runner writes them at the next step boundary, on the worker's own connection (a
  processor writing from whatever thread ends a span would share that connection across threads);
- over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, batched.

Inputs and outputs (a tool's arguments and result, a model's messages, an effect's arguments and answer) are
recorded as JSON with secret-named fields redacted (`logs.redact`) and cut at `CONTENT_MAX_CHARS`;
`AGENT_TRACE_CONTENT=0` records none. No credential value is ever passed to a span by the runtime.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from agent_runtime.host.logs import redact

__all__ = ["CONTENT_MAX_CHARS", "TASK_SPANS", "TaskSpanBuffer", "content", "content_enabled", "current_span_name",
           "setup_tracing", "span_row"]

log = logging.getLogger("agent_runtime.host.tracing")

CONTENT_MAX_CHARS = 4000
# Spans waiting for their task's next write; beyond this the oldest go (a task that never reaches a boundary).
BUFFER_MAX_SPANS = 20000
TASK_ATTRIBUTE = "agent.task_id"


def content_enabled(span: trace.Span) -> bool:
    """Whether `span` gets inputs and outputs: it records (no tracer provider: nothing to serialize for) and
    AGENT_TRACE_CONTENT does not turn them off."""
    return span.is_recording() and os.environ.get("AGENT_TRACE_CONTENT", "1").lower() not in ("0", "false", "no")


def content(value: Any) -> str:
    """`value` as a span attribute: JSON with secret-named fields redacted, at most CONTENT_MAX_CHARS."""
    try:
        text = json.dumps(redact(value), default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    # What the database and OTLP can carry: no NUL, no lone surrogate (a step's unstorable output still gets a span).
    text = text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= CONTENT_MAX_CHARS else text[:CONTENT_MAX_CHARS - 1] + "…"


def current_span_name() -> str:
    """The name of the span now current ('' when none is recording): `ctx.usage` asks whether it is inside a
    model call's span already."""
    span = trace.get_current_span()
    return str(getattr(span, "name", "")) if span.is_recording() else ""


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _attr(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def span_row(span: ReadableSpan, task_id: str) -> dict[str, Any]:
    """A finished span as the row `state.traces.spans_write` stores."""
    ctx = span.get_span_context()
    assert ctx is not None
    attributes = {k: _attr(v) for k, v in (span.attributes or {}).items()}
    for event in span.events:
        if event.name == "exception" and event.attributes:
            attributes.setdefault("exception.type", str(event.attributes.get("exception.type", "")))
            attributes.setdefault("exception.message", str(event.attributes.get("exception.message", ""))[:1000])
            break
    start, end = span.start_time or 0, span.end_time or span.start_time or 0
    return {"task_id": task_id, "trace_id": _hex(ctx.trace_id, 32), "span_id": _hex(ctx.span_id, 16),
            "parent_span_id": _hex(span.parent.span_id, 16) if span.parent is not None else None,
            "name": span.name, "kind": span.kind.name.lower(), "status": span.status.status_code.name.lower(),
            "started_at": datetime.fromtimestamp(start / 1e9, tz=UTC),
            "duration_ms": max(0.0, (end - start) / 1e6), "attributes": attributes}


class TaskSpanBuffer(SpanProcessor):
    """Finished spans of each task, in memory until the runner takes them (`take`) to write them.

    A span belongs to the task of its trace: the run's root span (`invoke_agent`) carries `agent.task_id` when it
    starts, and every span of that trace is the task's, whoever opened it (the SDK, `ChatModel`, an agent's own
    tracer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[int, str] = {}  # trace id -> task id, while the run's root span is open
        self._done: list[dict[str, Any]] = []

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        task = (span.attributes or {}).get(TASK_ATTRIBUTE)
        if task and span.parent is None:
            with self._lock:
                self._tasks[span.context.trace_id] = str(task)

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        with self._lock:
            task = self._tasks.get(ctx.trace_id)
            if task is None:
                return
            if span.parent is None:
                self._tasks.pop(ctx.trace_id, None)
            self._done.append(span_row(span, task))
            if len(self._done) > BUFFER_MAX_SPANS:
                del self._done[: len(self._done) - BUFFER_MAX_SPANS]

    def take(self, task_id: str) -> list[dict[str, Any]]:
        """The finished spans of `task_id` not taken yet (removed from the buffer)."""
        with self._lock:
            mine = [row for row in self._done if row["task_id"] == task_id]
            if mine:
                self._done = [row for row in self._done if row["task_id"] != task_id]
        return mine

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


TASK_SPANS = TaskSpanBuffer()


def setup_tracing(env: Mapping[str, str], *, tenant_id: str, release: str = "") -> TracerProvider:
    """Install the process's tracer provider: every span to `TASK_SPANS`, and over OTLP/HTTP when the standard
    endpoint variables say where (the exporter reads them itself: `OTEL_EXPORTER_OTLP_ENDPOINT` gets `/v1/traces`
    appended, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is taken as is; headers, timeout and batching by their
    standard variables too). Called once per process (agent-host, a pinned child)."""
    attributes = {"service.name": env.get("OTEL_SERVICE_NAME") or "agent-host", "agent.tenant_id": tenant_id}
    if release:
        attributes["service.version"] = release
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(TASK_SPANS)
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("traces exported over OTLP/HTTP", extra={"event": "traces_export"})
    trace.set_tracer_provider(provider)
    return provider

