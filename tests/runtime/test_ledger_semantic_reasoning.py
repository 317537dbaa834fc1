"""Effect ledger (in-doubt resolution, human decisions), semantic memory (hash + real MiniLM), the
OpenAI-compatible planner against a local stub, and per-step OpenTelemetry spans."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agent_examples.demo import DemoAgent
from agent_examples.planner import OpenAIChatPlanner
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg.types.json import Jsonb

from agent_runtime.effects.ledger import args_digest, idempotency_key
from agent_runtime.errors import CredentialUnavailable, TaskBlocked
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.state import tasks
from agent_runtime.state.rowchecks import effect_checksum
from agent_runtime.state.semantic import HashEmbedder, MiniLMEmbedder, SemanticIndex
from agent_runtime.state.semantic_layout import table_for

from .conftest import Sinks


class WebhookEffect:
    """An effect whose provider cannot be asked about past calls."""

    supports_lookup = False
    replay_safe = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(idem_key)
        return {"ok": True}

    def lookup(self, idem_key: str) -> Any:
        raise NotImplementedError


def _intent(rt: Runtime, tid: Any, step: str, effect: str, args: dict[str, Any]) -> str:
    """The row an intent leaves when the process dies between committing it and calling the provider."""
    key = idempotency_key(tid, step, effect)
    digest = args_digest(args)
    rt.conn.execute("INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, ordinal,"
                    " checksum) VALUES (%s, %s, %s, %s, %s, %s, 'intent', 0, %s)",
                    (tid, step, effect, key, Jsonb(args), digest,
                     effect_checksum(key, tid, step, effect, digest, "intent", None, None, 0, None)))
    return key


def test_replay_returns_recorded_result_and_in_doubt_resolves_by_lookup(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    tid = tasks.submit(rt.conn, "demo", {})
    pay = rt.effects["payment"]
    first = rt.ledger.run(tid, "pay", "payment", pay, {"amount": 10, "currency": "EUR", "to": "a"})
    again = rt.ledger.run(tid, "pay", "payment", pay, {"amount": 99, "currency": "EUR", "to": "b"})
    assert again == first and sinks.payment_stats()["posts"] == 1
    # Intent recorded, process died before the call: lookup says absent -> performed once with recorded args.
    _intent(rt, tid, "pay2", "payment", {"amount": 20, "currency": "EUR", "to": "c"})
    res = rt.ledger.run(tid, "pay2", "payment", pay, {"amount": 21, "currency": "EUR", "to": "regenerated"})
    assert res["params"]["amount"] == 20
    # Intent recorded and the provider did get it: lookup finds it, no second POST.
    key = _intent(rt, tid, "pay3", "payment", {"amount": 30, "currency": "EUR", "to": "d"})
    pay.perform(key, {"amount": 30, "currency": "EUR", "to": "d"})
    posts = sinks.payment_stats()["posts"]
    replay = rt.ledger.run(tid, "pay3", "payment", pay, {"amount": 30, "currency": "EUR", "to": "d"})
    assert replay["idempotency_key"] == key
    assert sinks.payment_stats()["posts"] == posts
    assert rt.ledger.get(key).resolution == "provider_lookup:found"


def test_in_doubt_without_lookup_blocks_for_a_human(runtime: Runtime) -> None:
    rt = runtime
    hook = WebhookEffect()
    tid = tasks.submit(rt.conn, "demo", {})
    key = _intent(rt, tid, "notify", "webhook", {"url": "x"})
    with pytest.raises(TaskBlocked, match="effect_in_doubt"):
        rt.ledger.run(tid, "notify", "webhook", hook, {"url": "x"})
    with pytest.raises(TaskBlocked):
        rt.ledger.run(tid, "notify", "webhook", hook, {"url": "x"})
    assert hook.calls == []  # never a blind retry
    rt.ledger.decide(key, performed=False)  # a human checked: it never went out
    assert rt.ledger.run(tid, "notify", "webhook", hook, {"url": "x"}) == {"ok": True}
    assert hook.calls == [key]


def test_semantic_memory_no_reembedding_and_backup_restore(runtime: Runtime) -> None:
    rt = runtime
    idx = SemanticIndex(rt.conn, rt.store, HashEmbedder())
    docs = {"d1": "heat pumps move heat from outside air", "d2": "solar panels convert light",
            "d3": "batteries store electricity"}
    assert all(idx.add(k, v) for k, v in docs.items())
    assert not idx.add("d1-copy", docs["d1"]) and idx.embed_calls == 3
    assert idx.search("solar light panels", k=1)[0].doc_id == "d2"
    idx.backup()
    rt.conn.execute(f"DELETE FROM {table_for(idx.model)}")  # e.g. schema rebuilt
    fresh = SemanticIndex(rt.conn, rt.store, HashEmbedder())
    info = fresh.boot()
    assert info["restored"] == 4 and info["layout"] == "bytea" and fresh.embed_calls == 0  # d1-copy too
    assert fresh.search("batteries electricity", k=1)[0].doc_id == "d3"


def test_semantic_memory_with_real_local_minilm(runtime: Runtime) -> None:
    idx = SemanticIndex(runtime.conn, runtime.store, MiniLMEmbedder())
    idx.add("cat", "The cat sat on the mat and purred.")
    idx.add("tax", "Quarterly VAT returns are due at the end of the month.")
    idx.add("db", "PostgreSQL stores rows in heap pages.")
    hits = idx.search("when do I have to file my sales tax?", k=3)
    assert hits[0].doc_id == "tax" and hits[0].score > hits[1].score
    row = runtime.conn.execute("SELECT dim, layout FROM semantic_models WHERE model = %s", (idx.model,)).fetchone()
    assert row == (384, "bytea")  # the machine's PostgreSQL has no pgvector


class LLMStub:
    def __init__(self, key: str) -> None:
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"auth": self.headers.get("Authorization"), "body": body})
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self.send_response(401)
                    self.end_headers()
                    return
                system = body["messages"][0]["content"]
                content = json.dumps(["q one", "q two"]) if "JSON list" in system else "LLM report"
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture
def llm() -> Iterator[LLMStub]:
    stub = LLMStub("sk-test-key")
    yield stub
    stub.server.shutdown()
    stub.server.server_close()


def test_openai_planner_runs_demo_with_spans_per_step(runtime: Runtime, llm: LLMStub, sinks: Sinks) -> None:
    rt = runtime
    rt.credentials.set("openai", "sk-test-key")  # type: ignore[attr-defined]
    rt.agent_config = {"planner": "openai", "llm_url": llm.url, "llm_model": "test-model"}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt.tracer = provider.get_tracer("test")
    tid = tasks.submit(rt.conn, "demo", {"search_s": 0})
    assert run_task(rt, DemoAgent(), tid) == "done"
    assert llm.requests and all(r["auth"] == "Bearer sk-test-key" for r in llm.requests)
    assert rt.checkpoints.case_file(rt.checkpoints.latest(tid)).notes["queries"] == ["q one", "q two"]
    from agent_runtime.host.runner import task_workdir

    assert (task_workdir(rt, tid) / "report.md").read_text() == "LLM report" and len(sinks.emails()) == 1
    spans = {s.name: s for s in exporter.get_finished_spans()}
    cps = {cp.step: cp.id for cp in rt.checkpoints.list(tid)}
    for step in ("plan", "search", "write_files", "scan", "send_email", "pay", "snapshot"):
        assert spans[f"step {step}"].attributes["agent.checkpoint_id"] == cps[step]
    # Revoked key: the planner asks the credential source every call, so it stops working at once.
    rt.credentials.revoke("openai")  # type: ignore[attr-defined]
    with pytest.raises(CredentialUnavailable):
        OpenAIChatPlanner(llm.url, "test-model", rt.credentials).plan_queries("x")
