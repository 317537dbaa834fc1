"""Traces (issue 37, docs/observability.md): a real agent-host runs the support agent against the local
chat-completions peer (a real process returning token usage), with a tool call (`lookup_order`), model calls and
an effect (`ticket`, an email through the SMTP sink). Its spans are exported over OTLP/HTTP to a receiver in this
test that decodes them with the official `opentelemetry-proto` messages, carry the GenAI attributes (operation,
agent, tool name, request model, token counts equal to what the peer answered) and the effect's idempotency key
and outcome, are kept in the tenant's schema under the task, and are drawn, the same span ids, as the waterfall on
the dashboard's and the portal's task page, read through the signed instance API like the rest of the page.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from instances.client import forget_tenant
from portal.models import OperatorMembership
from provisioning.models import AgentInstance
from tenants.actors import SYSTEM
from tenants.services import operator_create
from tests.runtime.harness import (
    ROOT,
    HostRunner,
    Proc,
    admin_dsn,
    create_tenant_db,
    drop_tenant_db,
    make_env,
    start_peer,
)
from tests.vault.test_vault_helpers import make_instance, make_tenant

pytestmark = pytest.mark.django_db

PORTAL_HOST = "traces.localhost"
API_KEY = "sk-traces-" + secrets.token_hex(8)
QUESTION = "Order 1042 arrived damaged, I want a refund."


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.requests: list[ExportTraceServiceRequest] = []
        self.raw: list[bytes] = []
        self.content_types: list[str] = []


class _OtlpHandler(BaseHTTPRequestHandler):
    """OTLP/HTTP's trace endpoint: a protobuf `ExportTraceServiceRequest` in, an empty response out."""

    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append(request)
        self.server.raw.append(body)
        self.server.content_types.append(self.headers.get("Content-Type", ""))
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def exported_spans(receiver: _Receiver) -> list[dict[str, Any]]:
    """Every span the receiver decoded, with its resource's attributes."""
    out = []
    for request in list(receiver.requests):
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    out.append({"name": sp.name, "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                                "parent": sp.parent_span_id.hex() or None, "resource": resource,
                                "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in sp.attributes}})
    return out


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The chat-completions peer and the SMTP sink, as real processes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), str(ROOT / "examples"))))
    procs: list[Proc] = []
    try:
        chat, chat_port = start_peer("chat_model", {**env, "AGENT_CHAT_API_KEY": API_KEY,
                                                    "AGENT_CHAT_LOG": str(tmp_path / "chat.jsonl")}, tmp_path)
        procs.append(chat)
        smtp, smtp_port = start_peer("smtp", {**env, "AGENT_SMTP_SINK_LOG": str(tmp_path / "smtp.jsonl")}, tmp_path)
        procs.append(smtp)
        yield {"llm_url": f"http://127.0.0.1:{chat_port}/v1", "smtp_url": f"smtp://127.0.0.1:{smtp_port}",
               "chat_log": str(tmp_path / "chat.jsonl")}
    finally:
        for p in procs:
            p.stop()


def _wait(predicate: Any, what: str, timeout: float = 30.0, output: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}:\n{output() if output else ''}"
        time.sleep(0.05)


def test_a_task_with_a_tool_a_model_and_an_effect_is_traced_exported_stored_and_drawn(
        tmp_path: Path, receiver: _Receiver, peers: dict[str, str]) -> None:
    op = operator_create(slug=f"tr-{secrets.token_hex(3)}", name="Trace Op", actor=SYSTEM, domains=[PORTAL_HOST])
    tenant = make_tenant(op)
    token = make_instance(tenant)
    db = create_tenant_db(admin_dsn(), prefix="tr")
    hosts = HostRunner(tmp_path)
    try:
        config = {"llm_url": peers["llm_url"], "llm_model": "local-support", "helpdesk_email": "help@tenant.test",
                  "orders": {"1042": {"status": "shipped", "carrier": "DHL"}}}
        env = make_env(db, tmp_path / "host", AGENT_TENANT_ID=str(tenant.pk), AGENT_INSTANCE_TOKEN=token,
                       AGENT_CONFIG=json.dumps(config), AGENT_CREDENTIAL_OPENAI=API_KEY,
                       AGENT_EFFECTS=json.dumps({"ticket": {"type": "smtp", "url": peers["smtp_url"]}}),
                       OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver.server_address[1]}",
                       OTEL_BSP_SCHEDULE_DELAY="100")
        with connect(db.dsn, db.schema, autocommit=True) as c:
            migrate(c, db.schema)
            task_id = str(tasks.submit(c, "support", {"thread": "cust-1", "question": QUESTION}))
        host = hosts.start(env)
        _wait(lambda: _status(db, task_id) in ("done", "blocked", "failed"), "the task never ended", 60, host.output)
        assert _status(db, task_id) == "done", host.output()[-3000:]
        _wait(lambda: any(s["name"] == "invoke_agent support" for s in exported_spans(receiver)),
              "the run's span was never exported", 15, host.output)

        spans = exported_spans(receiver)
        assert set(receiver.content_types) == {"application/x-protobuf"}
        by_name: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            by_name.setdefault(s["name"], []).append(s)
        [run] = by_name["invoke_agent support"]
        assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
        assert run["attributes"]["gen_ai.agent.name"] == "support"
        assert run["attributes"]["agent.task_id"] == task_id and run["attributes"]["agent.outcome"] == "done"
        assert run["attributes"]["gen_ai.conversation.id"] == "cust-1"
        assert run["parent"] is None and run["resource"]["service.name"] == "agent-host"
        assert run["resource"]["agent.tenant_id"] == str(tenant.pk)
        assert {s["trace_id"] for s in spans} == {run["trace_id"]}  # one run, one trace
        parents = {s["span_id"]: s["parent"] for s in spans}

        def under(span: dict[str, Any], ancestor: dict[str, Any]) -> bool:
            p = span["parent"]
            while p is not None:
                if p == ancestor["span_id"]:
                    return True
                p = parents.get(p)
            return False

        steps = {n: by_name[f"step {n}"][0] for n in ("remember", "answer", "reply")}
        assert all(s["parent"] == run["span_id"] for s in steps.values())
        assert all(s["attributes"]["agent.checkpoint_id"] > 0 for s in steps.values())
        # The tool call.
        [lookup] = by_name["execute_tool lookup_order"]
        assert lookup["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert lookup["attributes"]["gen_ai.tool.name"] == "lookup_order"
        assert lookup["attributes"]["agent.tool.cached"] is False and under(lookup, steps["answer"])
        assert '"order_id": "1042"' in lookup["attributes"]["gen_ai.tool.call.arguments"]
        assert '"shipped"' in lookup["attributes"]["gen_ai.tool.call.result"]
        # The model calls: one span per completion, with the tokens the peer answered (the same as billed).
        chats = by_name["chat local-support"]
        completions = [json.loads(line) for line in Path(peers["chat_log"]).read_text().splitlines() if line]
        assert len(chats) == len(completions) == 3
        with connect(db.dsn, db.schema, autocommit=True) as c:
            billed = c.execute("SELECT usage_key, input_tokens, output_tokens FROM model_usage"
                               " ORDER BY id").fetchall()
            stored = c.execute("SELECT span_id, name, attributes FROM trace_spans WHERE task_id = %s",
                               (task_id,)).fetchall()
            [effect_row] = c.execute("SELECT idem_key, state FROM effects WHERE task_id = %s", (task_id,)).fetchall()
        assert sorted((f"call:{s['attributes']['gen_ai.response.id']}", s["attributes"]["gen_ai.usage.input_tokens"],
                       s["attributes"]["gen_ai.usage.output_tokens"]) for s in chats) == sorted(billed)
        for chat in chats:
            a = chat["attributes"]
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "local-support"
            assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
            assert a["gen_ai.provider.name"] == "openai" and under(chat, steps["answer"])
            assert "gen_ai.input.messages" in a and "gen_ai.output.messages" in a
        # The effect, with its idempotency key and outcome.
        [ticket] = by_name["effect ticket"]
        assert ticket["attributes"]["agent.effect.idempotency_key"] == effect_row[0]
        assert ticket["attributes"]["agent.effect.outcome"] == "performed" and effect_row[1] == "committed"
        assert under(ticket, steps["answer"])
        # No credential value in anything exported.
        assert not any(API_KEY.encode() in raw for raw in receiver.raw)
        assert API_KEY not in json.dumps([s["attributes"] for s in spans])

        # Kept in the tenant's schema: the same spans, under the task.
        assert {r[0] for r in stored} == {s["span_id"] for s in spans}

        # Drawn on the task page, through the signed instance API, on the dashboard and in the portal.
        port = int((Path(env["AGENT_VOLUME"]) / ".host" / "http-port").read_text())
        AgentInstance.objects.filter(tenant=tenant).update(endpoint=f"http://127.0.0.1:{port}")
        forget_tenant(str(tenant.pk))
        staff = User.objects.create_user("trace-staff", is_staff=True)
        staff.user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
        member = User.objects.create_user("trace-member")
        OperatorMembership.objects.create(user=member, operator=op, role="viewer")
        dash = Client()
        dash.force_login(staff)
        portal = Client(HTTP_HOST=PORTAL_HOST)
        portal.force_login(member)
        for page in (dash.get(f"/dashboard/tenants/{tenant.pk}/tasks/{task_id}/"),
                     portal.get(f"/customers/{tenant.pk}/tasks/{task_id}/")):
            assert page.status_code == 200
            html = page.content.decode()
            svg = re.search(r'<div data-testid="task-trace">(<svg .*?</svg>)</div>', html, re.S)
            assert svg is not None, html[:3000]
            rows = re.findall(r'<g class="span-row" data-span="([^"]+)">', svg.group(1))
            assert sorted(rows) == sorted(s["name"] for s in spans)  # one bar per span, every span
            bars = re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg.group(1))
            assert len(bars) == len(spans) and len({x for x, _w in bars}) > 1  # offset by time
            assert rows[0] == "invoke_agent support"  # the run first, its spans under it in tree order
            tokens = sum(s["attributes"]["gen_ai.usage.input_tokens"] + s["attributes"]["gen_ai.usage.output_tokens"]
                         for s in chats)
            assert sum(int(t) for t in re.findall(r"· (\d+) tok<", svg.group(1))) == tokens
            assert effect_row[0] in html and API_KEY not in html
    finally:
        hosts.stop_all()
        drop_tenant_db(db, admin_dsn())


def _status(db: Any, task_id: str) -> str:
    with connect(db.dsn, db.schema, autocommit=True) as c:
        row = c.execute("SELECT status FROM tasks WHERE id = %s", (uuid.UUID(task_id),)).fetchone()
    return str(row[0]) if row else ""
