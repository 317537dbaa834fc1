"""The support agent (agent_examples.support) against a local model speaking the OpenAI chat-completions wire
format over HTTP (agent_examples.peers.chat_model, a real process).

In process: the tool-call loop (order lookup, a ticket through the effect ledger, the answer), the thread's
history in the next prompt, and a re-run of every step after its own writes. As real agent-host processes: a
question that needs a tool, then a SIGKILL while the model composes its answer after a tool result, and a
restart: each message is in the thread once and only the completion that was in flight is requested again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_examples import support

from agent_runtime.db import connect
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Context, Step
from agent_runtime.state import tasks
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.migrations import migrate

from .conftest import ROOT, HostRunner, Proc, Sinks, TenantDB
from .test_host import wait_status

API_KEY = "sk-test-" + uuid.uuid4().hex
ORDERS = {"1042": {"status": "shipped", "carrier": "DHL", "eta": "2026-12-04"},
          "2077": {"status": "delivered", "carrier": "UPS", "delivered_on": "2026-11-28"}}


@dataclass
class ChatPeer:
    url: str  # what an agent configures as llm_url
    log: Path
    hold_file: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


@pytest.fixture
def chat_peer(tmp_path: Path) -> Iterator[ChatPeer]:
    base = tmp_path / "chat"
    base.mkdir()
    port_file = base / "port"
    peer = ChatPeer("", base / "requests.jsonl", base / "hold")
    # This checkout's examples, not whichever the environment has installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), str(ROOT / "examples"))),
               AGENT_CHAT_API_KEY=API_KEY, AGENT_CHAT_LOG=str(peer.log),
               AGENT_CHAT_HOLD_FILE=str(peer.hold_file), AGENT_SINK_PORT_FILE=str(port_file))
    proc = Proc([sys.executable, "-m", "agent_examples.peers.chat_model"], env, base / "chat.log")
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert time.monotonic() < deadline, "chat model peer did not start:\n" + proc.output()
            time.sleep(0.02)
        peer.url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
        yield peer
    finally:
        peer.hold_file.unlink(missing_ok=True)  # releases a handler still holding a completion
        proc.stop()


def config_for(peer: ChatPeer, **extra: Any) -> dict[str, Any]:
    return {"llm_url": peer.url, "llm_model": "local-support", "orders": ORDERS, **extra}


def thread_log(conn: psycopg.Connection, thread: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.role, m.content, m.metadata) for m in MemoryStore(conn).in_thread(thread).since(0)]


def step_starts(conn: psycopg.Connection, task_id: uuid.UUID | str) -> Counter[str]:
    rows = conn.execute("SELECT step FROM step_events WHERE task_id = %s AND event = 'start'", (task_id,))
    return Counter(r[0] for r in rows)


def configure(runtime: Runtime, peer: ChatPeer, **extra: Any) -> None:
    runtime.agent_config = config_for(peer, **extra)
    runtime.credentials.set("openai", API_KEY)  # type: ignore[attr-defined]


def test_tool_loop_looks_up_opens_a_ticket_and_answers(runtime: Runtime, sinks: Sinks, chat_peer: ChatPeer) -> None:
    configure(runtime, chat_peer, helpdesk_email="help@tenant.test")
    runtime.effects["ticket"] = SmtpEffect(sinks.smtp_url)
    conn = runtime.conn
    first = tasks.submit(conn, "support", {"thread": "cust-1", "question": "Order 1042 arrived damaged, I want a "
                                                                         "refund."})
    assert run_task(runtime, support.agent, first) == "done"

    reqs = chat_peer.requests()
    assert [r["answer"] for r in reqs] == ["tool_calls:lookup_order", "tool_calls:open_ticket", "stop"]
    assert all(r["tools"] == ["lookup_order", "open_ticket", "search_kb"] for r in reqs)
    assert reqs[2]["roles"] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    emails = sinks.emails()
    assert len(emails) == 1 and emails[0]["to"] == ["help@tenant.test"]
    # strip(): Python's email folds a long Subject right after "Subject:" and keeps the fold's space on parsing.
    assert emails[0]["subject"].strip().startswith("[support/high] Order 1042")
    [ticket] = runtime.ledger.for_task(first)
    assert (ticket.effect, ticket.state) == ("ticket", "committed")
    [(q_role, q_text, q_meta), (a_role, answer, a_meta)] = thread_log(conn, "cust-1")
    assert (q_role, q_text, q_meta) == ("user", "Order 1042 arrived damaged, I want a refund.",
                                        {"task": str(first), "turn": "question"})
    assert a_role == "assistant" and a_meta["tools"] == ["lookup_order", "open_ticket"]
    assert ticket.result is not None
    assert '"status": "shipped"' in answer and ticket.result["message_id"] in answer  # quotes both tool results

    # The next question in the thread: the model is shown the earlier turn, answers from the knowledge base.
    second = tasks.submit(conn, "support", {"thread": "cust-1", "question": "How long does shipping take?"})
    assert run_task(runtime, support.agent, second) == "done"
    reqs = chat_peer.requests()[3:]
    assert [r["answer"] for r in reqs] == ["tool_calls:search_kb", "stop"]
    assert reqs[0]["roles"] == ["system", "user", "assistant", "user"]
    assert [m[0] for m in thread_log(conn, "cust-1")] == ["user", "assistant", "user", "assistant"]
    assert "Shipping times" in thread_log(conn, "cust-1")[3][1]
    assert len(sinks.emails()) == 1
    # Each completion's token usage, as the peer answered it, recorded once under the completion's id.
    usage = model_usage(conn)
    assert [u[0] for u in usage] == [r["model"] for r in chat_peer.requests()]
    assert all(i > 0 and o > 0 and key.startswith("call:chatcmpl-") for _m, i, o, key in usage)

    # The API key is read from the credential source at each call: without it nothing is sent to the model.
    runtime.credentials.revoke("openai")  # type: ignore[attr-defined]
    third = tasks.submit(conn, "support", {"thread": "cust-1", "question": "Thanks!"})
    assert run_task(runtime, support.agent, third) == "blocked"
    blocked = tasks.get(conn, third)
    assert blocked is not None and blocked.blocked_reason == "credential_unavailable"
    assert len(chat_peer.requests()) == 5


def model_usage(conn: psycopg.Connection[Any]) -> list[tuple[str, int, int, str]]:
    """(model, input tokens, output tokens, key) of every model call the agent reported, in order."""
    return [tuple(r) for r in conn.execute(  # type: ignore[misc]
        "SELECT model, input_tokens, output_tokens, usage_key FROM model_usage ORDER BY id").fetchall()]


class DiesAfterEachStep:
    """The support agent, except that each step's first attempt raises after the step's own writes: for the
    durable state, a crash just before the step's checkpoint (the step runs again)."""

    kind = "support"

    def __init__(self) -> None:
        self.died: set[str] = set()

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return [Step(s.name, self._dying(s), s.max_attempts, s.timeout_s) for s in support.agent.steps(params)]

    def _dying(self, step: Step) -> Any:
        def run(ctx: Context) -> Any:
            out = step.fn(ctx)
            if step.name not in self.died:
                self.died.add(step.name)
                raise RuntimeError(f"died after the writes of {step.name}")
            return out

        return run


def test_each_step_run_again_after_its_writes_adds_nothing(runtime: Runtime, chat_peer: ChatPeer) -> None:
    configure(runtime, chat_peer)
    task_id = tasks.submit(runtime.conn, "support", {"thread": "cust-2", "question": "Where is order 2077?"})
    dying = DiesAfterEachStep()
    outcomes = [run_task(runtime, dying, task_id) for _ in range(4)]
    assert outcomes == ["retry", "retry", "retry", "done"]
    assert step_starts(runtime.conn, task_id) == {"remember": 2, "answer": 2, "reply": 2}
    log = thread_log(runtime.conn, "cust-2")
    assert [(role, meta["turn"]) for role, _text, meta in log] == [("user", "question"), ("assistant", "answer")]
    assert '"status": "delivered"' in log[1][1]
    # The answer step ran twice; both of its completions were paid for once, and their tokens counted once.
    assert [r["answer"] for r in chat_peer.requests()] == ["tool_calls:lookup_order", "stop"]
    assert len(model_usage(runtime.conn)) == 2


def test_host_answers_and_survives_sigkill_mid_completion(tenant_db: TenantDB, host_env: dict[str, str],
                                                          hosts: HostRunner, chat_peer: ChatPeer) -> None:
    # No AGENT_APP: the host finds `support` through the examples distribution's entry point.
    env = {**host_env, "AGENT_CONFIG": json.dumps(config_for(chat_peer)), "AGENT_CREDENTIAL_OPENAI": API_KEY}
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        first = tasks.submit(c, "support", {"thread": "cust-9", "question": "Where is my order 1042?"})
    host = hosts.start(env)
    assert wait_status(tenant_db, first, ("done", "blocked", "failed")) == "done", host.output()[-3000:]
    assert [r["answer"] for r in chat_peer.requests()] == ["tool_calls:lookup_order", "stop"]

    # Second question; the model holds the completion that follows the tool result, and the host dies in it.
    chat_peer.hold_file.touch()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        second = tasks.submit(c, "support", {"thread": "cust-9", "question": "And order 2077?"})
    deadline = time.monotonic() + 20
    while len(chat_peer.requests()) < 4:
        assert time.monotonic() < deadline, "the second completion never arrived:\n" + host.output()[-3000:]
        time.sleep(0.05)
    host.kill(signal.SIGKILL)
    host.wait(timeout=10)
    chat_peer.hold_file.unlink()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        row = c.execute("SELECT status FROM tasks WHERE id = %s", (second,)).fetchone()
        assert row is not None and row[0] == "running"
    restarted = hosts.start(env)
    assert wait_status(tenant_db, second, ("done", "blocked", "failed")) == "done", restarted.output()[-3000:]

    reqs = chat_peer.requests()
    assert [r["answer"] for r in reqs] == ["tool_calls:lookup_order", "stop"] * 2 + ["stop"]
    assert reqs[3]["held"] and not reqs[4]["held"]
    assert reqs[2]["roles"] == ["system", "user", "assistant", "user"]  # the first turn is in the prompt
    # The completion that asked for the lookup was cached before the kill and not requested again; the one in
    # flight was, with the very same conversation (the tool-call id from the recorded completion included).
    assert Counter(r["digest"] for r in reqs)[reqs[2]["digest"]] == 1
    assert reqs[4]["digest"] == reqs[3]["digest"]
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        log = thread_log(c, "cust-9")
        assert step_starts(c, second) == {"remember": 1, "answer": 2, "reply": 1}
    assert [(role, meta["task"], meta["turn"]) for role, _text, meta in log] == [
        ("user", str(first), "question"), ("assistant", str(first), "answer"),
        ("user", str(second), "question"), ("assistant", str(second), "answer")]
    assert '"status": "shipped"' in log[1][1] and '"status": "delivered"' in log[3][1]
    assert API_KEY not in host.output() + restarted.output()


def test_an_mcp_servers_tools_are_offered_to_the_model_next_to_the_built_in_ones(
        runtime: Runtime, chat_peer: ChatPeer, tmp_path: Path) -> None:
    from agent_runtime.mcp.config import servers_validate

    from .test_mcp_tools import TOKEN, start_mcp_peer

    peer = start_mcp_peer(tmp_path, tmp_path / "mcp-calls.jsonl")
    try:
        configure(runtime, chat_peer, mcp_server="crm")
        runtime.mcp_servers = servers_validate({"crm": {"url": peer.url, "credential": "crm-token",
                                                        "allowed_tools": ["lookup_order", "upsert_contact"]}})
        runtime.credentials.set("crm-token", TOKEN)  # type: ignore[attr-defined]
        task = tasks.submit(runtime.conn, "support", {
            "thread": "mcp-1", "question": "Where is order 1042? My new email is ada@example.com"})
        assert run_task(runtime, support.agent, task) == "done"
        # The server's allowed tools join the built-in ones (its lookup_order loses to the built-in of that name).
        offered = [r["tools"] for r in chat_peer.requests()]
        assert offered and all(t == ["lookup_order", "search_kb", "upsert_contact"] for t in offered), offered
        assert [r["answer"] for r in chat_peer.requests()] == [
            "tool_calls:lookup_order", "tool_calls:upsert_contact", "stop"]
        assert peer.calls("lookup_order") == []  # the built-in answered
        # The model's call of the MCP tool reached the server once, with the model's arguments.
        assert [c["args"] for c in peer.calls("upsert_contact")] == [{"email": "ada@example.com", "name": "Ada"}]
        [(_q, _qt, _qm), (_a, answer, meta)] = thread_log(runtime.conn, "mcp-1")
        assert meta["tools"] == ["lookup_order", "upsert_contact"] and "ada@example.com" in answer
    finally:
        peer.proc.stop()
