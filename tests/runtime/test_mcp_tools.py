"""MCP tools from an agent, each call where its kind belongs, against a real MCP server (the official `mcp` SDK's
MCPServer over streamable HTTP, `examples/agent_examples/peers/crm.py`, in its own process) and real agent-host
processes killed with SIGKILL:

- a kill while the destructive tool's call is in flight (the peer holds its answer) leaves the effect in doubt:
  after the restart the task is blocked `effect_in_doubt`, the peer saw exactly one call, and a human's decision
  lets it finish without a second one;
- a kill after the destructive call was committed, before the step's checkpoint: the replay returns the recorded
  result without a second call, serves the read-only lookup from the tool cache, and calls the idempotent
  upsert again;
- SIGKILLs (`MCP_KILLS`: the issue's 30 by default), each at a random moment inside a
  destructive call, one peer process throughout: the peer saw each task's transfer at most once, and every call
  left in doubt is an open effect of a task blocked for a human;
- a revoked credential or a disconnected account: the cached read is not served, nothing is sent;
- the kinds come from the tool's annotations, and the operator's per-tool override in the task's configuration
  wins over them;
- the same tools as LangGraph tools (`integrations.langgraph.mcp_tools`), a kill inside the graph's tools node
  after the destructive call: the re-run node is answered from the ledger (keyed by the graph's logical step),
  the read from the cache, the idempotent call made again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.effects.ledger import EffectLedger, idempotency_key
from agent_runtime.integrations.langgraph import TenantCheckpointer, thread_task_id
from agent_runtime.mcp.client import IDEMPOTENCY_META_KEY
from agent_runtime.state import tasks
from agent_runtime.state.checkpoints import CheckpointStore
from tests.docblocks import doc_blocks, write_titled_blocks

from .conftest import ROOT, HostRunner, Proc, TenantDB, make_env
from .test_host import wait_status

APP = "tests.runtime.mcp_agents:AGENTS"
TOKEN = "peer-secret-token"


@dataclass
class McpPeer:
    url: str
    call_log: Path
    proc: Proc

    def sessions(self) -> int:
        """Sessions opened at the peer: `server/discover` (`initialize` under an older protocol version)."""
        return len(self.calls("_server/discover")) + len(self.calls("_initialize"))

    def calls(self, tool: str) -> list[dict[str, Any]]:
        if not self.call_log.exists():
            return []
        return [c for c in map(json.loads, self.call_log.read_text().splitlines()) if c["tool"] == tool]


def _pythonpath() -> str:
    # The runtime's checkout, and whatever the test run was given (where `mcp` lives when it is not in the venv).
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def start_mcp_peer(tmp_path: Path, call_log: Path, **extra: str) -> McpPeer:
    """The peer in its own process, once it listens; its calls logged to `call_log` (shared by restarts)."""
    port_file = tmp_path / f"mcp-peer-{uuid.uuid4().hex[:6]}.port"
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "MCP_PEER_PORT_FILE": str(port_file),
           "MCP_PEER_CALL_LOG": str(call_log), "MCP_PEER_TOKEN": TOKEN, **extra}
    proc = Proc([sys.executable, "-m", "agent_examples.peers.crm"], env, tmp_path / "mcp-peer.log")
    deadline = time.monotonic() + 20
    while not port_file.exists():
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            raise AssertionError(proc.output()[-2000:])
        time.sleep(0.02)
    return McpPeer(f"http://127.0.0.1:{port_file.read_text()}/mcp", call_log, proc)


@pytest.fixture
def mcp_peer(tmp_path: Path) -> Iterator[McpPeer]:
    peer = start_mcp_peer(tmp_path, tmp_path / "mcp-calls.jsonl")
    try:
        yield peer
    finally:
        peer.proc.stop()


def _env(tenant_db: TenantDB, tmp_path: Path, peer: McpPeer, **extra: str) -> dict[str, str]:
    servers = {"peer": {"url": peer.url, "credential": "peer-token"}}
    return make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_MCP_SERVERS=json.dumps(servers),
                    AGENT_CREDENTIAL_PEER_TOKEN=TOKEN, PYTHONPATH=_pythonpath(), **extra)


def _wait(what: str, check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _effects(conn: psycopg.Connection, task_id: uuid.UUID) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT effect, state FROM effects WHERE task_id = %s ORDER BY id", (task_id,)).fetchall()]


def test_a_kill_during_the_destructive_call_leaves_it_in_doubt_for_a_human_never_called_twice(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    env = _env(tenant_db, tmp_path, mcp_peer)
    tid = tasks.submit(conn, "mcp-shop", {"order": "o-1", "delay_s": 60})
    host = hosts.start(env)
    # The peer has the call and is holding its answer back: the intent is committed, no outcome can be.
    _wait("the peer received send_money", lambda: len(mcp_peer.calls("send_money")) == 1)
    assert _effects(conn, tid) == [("mcp:peer/send_money", "intent")]
    host.kill(signal.SIGKILL)
    host.wait()

    hosts.start(env)
    hosts.wait_ready(env)
    assert wait_status(tenant_db, tid, ("blocked", "done")) == "blocked"
    row = conn.execute("SELECT blocked_reason FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert row == ("effect_in_doubt",)
    assert len(mcp_peer.calls("send_money")) == 1  # never re-called blind
    assert len(mcp_peer.calls("lookup_order")) == 1  # the replay was served the cached read
    assert len(mcp_peer.calls("upsert_contact")) == 2  # idempotent: simply called again
    key = idempotency_key(tid, "shop_step", "mcp:peer/send_money")
    # The ledger's key travelled in the request's _meta, for a server that de-duplicates by it.
    assert mcp_peer.calls("send_money")[0]["meta"][IDEMPOTENCY_META_KEY] == key
    assert _effects(conn, tid) == [("mcp:peer/send_money", "blocked")]

    # A human checked the peer's books: it was sent. The task finishes on that answer, with no second call.
    EffectLedger(conn, env["AGENT_TENANT_ID"]).decide(
        key, performed=True, result={"structuredContent": {"transfer": "tr_1", "checked_by": "ops"}})
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done"
    assert len(mcp_peer.calls("send_money")) == 1
    result = conn.execute("SELECT result FROM effects WHERE idem_key = %s", (key,)).fetchone()
    assert result == ({"structuredContent": {"transfer": "tr_1", "checked_by": "ops"}},)


def test_a_replay_after_a_crash_returns_the_recorded_effect_and_serves_the_read_from_the_cache(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    env = _env(tenant_db, tmp_path, mcp_peer)
    hold = tmp_path / "release-the-step"
    tid = tasks.submit(conn, "mcp-shop", {"order": "o-2", "hold_file": str(hold)})
    host = hosts.start(env)
    _wait("send_money committed", lambda: _effects(conn, tid) == [("mcp:peer/send_money", "committed")])
    first = conn.execute("SELECT result FROM effects WHERE task_id = %s", (tid,)).fetchone()
    host.kill(signal.SIGKILL)  # inside the step, after its effect, before its checkpoint
    host.wait()
    hold.touch()

    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done", conn.execute(
        "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert len(mcp_peer.calls("send_money")) == 1
    assert len(mcp_peer.calls("lookup_order")) == 1
    assert len(mcp_peer.calls("upsert_contact")) == 2
    store = CheckpointStore(conn)
    steps = store.case_file(store.latest(tid)).steps_done
    assert first is not None
    assert steps["shop_step"]["paid"] == first[0]["structuredContent"] == {"transfer": "tr_1", "to": "acct_ada",
                                                                           "amount": 4200}
    assert steps["shop_step"]["order"]["served"] == 1  # the cached output, not a second fetch
    described = steps["describe"]
    assert described["kinds"] == {"lookup_order": "read_only", "upsert_contact": "idempotent",
                                  "send_money": "effect"}
    send = next(t for t in described["tools"] if t["function"]["name"] == "send_money")
    assert send["type"] == "function" and send["function"]["parameters"]["required"] == ["to", "amount"]
    assert _effects(conn, tid) == [("mcp:peer/send_money", "committed")]


def test_the_operators_override_in_the_task_configuration_wins_over_the_annotations(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    # The customer's configuration names its own "peer": the server's hints are not trusted, except where pinned.
    config = {"mcp": {"peer": {"url": mcp_peer.url, "credential": "peer-token", "trust_annotations": False,
                               "tools": {"upsert_contact": "idempotent"}}}}
    env = _env(tenant_db, tmp_path, mcp_peer, AGENT_CONFIG=json.dumps(config))
    tid = tasks.submit(conn, "mcp-shop", {"order": "o-3"})
    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done"
    store = CheckpointStore(conn)
    steps = store.case_file(store.latest(tid)).steps_done
    assert steps["describe"]["kinds"] == {"lookup_order": "effect", "upsert_contact": "idempotent",
                                          "send_money": "effect"}
    assert _effects(conn, tid) == [("mcp:peer/lookup_order", "committed"), ("mcp:peer/send_money", "committed")]
    assert [len(mcp_peer.calls(t)) for t in ("lookup_order", "upsert_contact", "send_money")] == [1, 1, 1]


def test_a_revoked_credential_serves_no_cached_read_and_sends_nothing(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    env = _env(tenant_db, tmp_path, mcp_peer)
    first = tasks.submit(conn, "mcp-shop", {"order": "o-4"})
    host = hosts.start(env)
    assert wait_status(tenant_db, first, ("done", "blocked")) == "done"
    host.kill(signal.SIGKILL)
    host.wait()
    # The credential is revoked (without a control plane: gone from the instance's environment).
    revoked = {k: v for k, v in env.items() if k != "AGENT_CREDENTIAL_PEER_TOKEN"}
    second = tasks.submit(conn, "mcp-shop", {"order": "o-4"})  # the very read the cache holds
    hosts.start(revoked)
    assert wait_status(tenant_db, second, ("done", "blocked")) == "blocked"
    row = conn.execute("SELECT blocked_reason FROM tasks WHERE id = %s", (second,)).fetchone()
    assert row == ("credential_unavailable",)
    assert [len(mcp_peer.calls(t)) for t in ("lookup_order", "upsert_contact", "send_money")] == [1, 1, 1]
    assert _effects(conn, second) == []


def test_a_disconnected_account_serves_no_cached_read_and_sends_nothing(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    servers = {"peer": {"url": mcp_peer.url, "connection": "acme"}}  # the account's access token as the bearer
    env = {**_env(tenant_db, tmp_path, mcp_peer, AGENT_CONNECTION_ACME=TOKEN), "AGENT_MCP_SERVERS": json.dumps(servers)}
    first = tasks.submit(conn, "mcp-read", {"order": "o-c"})
    host = hosts.start(env)
    assert wait_status(tenant_db, first, ("done", "blocked")) == "done"
    host.kill(signal.SIGKILL)
    host.wait()
    # The customer disconnected the account (without a control plane: its token gone from the environment).
    gone = {k: v for k, v in env.items() if k != "AGENT_CONNECTION_ACME"}
    second = tasks.submit(conn, "mcp-read", {"order": "o-c"})  # the very read the cache holds
    hosts.start(gone)
    assert wait_status(tenant_db, second, ("done", "blocked")) == "blocked"
    row = conn.execute("SELECT blocked_reason FROM tasks WHERE id = %s", (second,)).fetchone()
    assert row == ("connection_needs_reauth",)
    assert len(mcp_peer.calls("lookup_order")) == 1


def test_the_reference_mcp_agent_of_the_sdk_page_runs_against_a_real_mcp_server(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    write_titled_blocks(doc_blocks(ROOT / "docs" / "sdk.md"), tmp_path / "page")
    servers = {"crm": {"url": mcp_peer.url, "credential": "crm-token"}}
    env = make_env(tenant_db, tmp_path, AGENT_APP="mcp_agent:agent", AGENT_MCP_SERVERS=json.dumps(servers),
                   AGENT_CREDENTIAL_CRM_TOKEN=TOKEN,
                   PYTHONPATH=os.pathsep.join((str(tmp_path / "page" / "reference"), _pythonpath())))
    tid = tasks.submit(conn, "orders", {"order": "o-9", "email": "ada@example.com", "name": "Ada", "account": "a-1"})
    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done"
    store = CheckpointStore(conn)
    assert store.case_file(store.latest(tid)).steps_done["refund"] == {
        "offered": ["lookup_order", "send_money", "upsert_contact"], "transfer": "tr_1"}
    assert _effects(conn, tid) == [("mcp:crm/send_money", "committed")]
    assert mcp_peer.calls("send_money")[0]["args"] == {"to": "a-1", "amount": 42}


def test_a_server_whose_hints_changed_after_a_crash_cannot_turn_a_recorded_effect_into_a_fresh_call(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    env = _env(tenant_db, tmp_path, mcp_peer)
    hold = tmp_path / "release-the-step"
    tid = tasks.submit(conn, "mcp-shop", {"order": "o-5", "hold_file": str(hold)})
    host = hosts.start(env)
    _wait("send_money committed", lambda: _effects(conn, tid) == [("mcp:peer/send_money", "committed")])
    host.kill(signal.SIGKILL)
    host.wait()
    # The server comes back claiming send_money is read-only; the replay must still answer from the ledger.
    mcp_peer.proc.stop()
    lying = start_mcp_peer(tmp_path, mcp_peer.call_log, MCP_PEER_LYING="1")
    try:
        hold.touch()
        hosts.start(_env(tenant_db, tmp_path, lying))
        assert wait_status(tenant_db, tid, ("done", "blocked")) == "done"
        store = CheckpointStore(conn)
        steps = store.case_file(store.latest(tid)).steps_done
        assert steps["describe"]["kinds"]["send_money"] == "read_only"  # what the server now says
        assert len(lying.calls("send_money")) == 1  # yet the recorded transfer answered the replay
        assert steps["shop_step"]["paid"] == {"transfer": "tr_1", "to": "acct_ada", "amount": 4200}
    finally:
        lying.proc.stop()


# The 30: at 3.5 to 5 s a round on a loaded 2-core machine (a host boots, imports the `mcp` SDK, recovers
# the last round's task) they take 100 to 160 s. MCP_KILLS sets another count.
KILLS = int(os.environ.get("MCP_KILLS", "30"))
SEND_DELAY_S = 0.25  # how long the peer holds send_money's answer: the window the kills land in


def test_sigkills_at_random_moments_inside_the_destructive_call_never_make_the_peer_send_twice(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    """KILLS rounds, one peer process throughout: a host starts, a task's send_money intent is committed, and at a
    random moment from then to a little past the peer's answer (before the request left, while the peer holds it,
    after the answer but before the outcome is committed, or after) the host is SIGKILLed. The peer must have seen
    each task's transfer at most once; a task whose call is in doubt is blocked for a human with its effect listed
    as open, never called again."""
    env = _env(tenant_db, tmp_path, mcp_peer, AGENT_POLL_INTERVAL_S="0.02", AGENT_STEP_MAX_ATTEMPTS="5")
    ids = {f"acct_{n}": tasks.submit(conn, "mcp-shop", {"order": f"o-{n}", "to": f"acct_{n}",
                                                        "delay_s": SEND_DELAY_S}) for n in range(KILLS)}
    rng = random.Random(34)  # noqa: S311 - reproducible kill moments, not a secret
    seen = 0  # the highest effect id of an earlier round: this round waits for a newer intent
    rounds: list[float] = []
    began = time.monotonic()
    for _ in range(KILLS):
        t0 = time.monotonic()
        host = hosts.start(env)

        def fresh_intent() -> int | None:
            row = conn.execute("SELECT max(id) FROM effects WHERE id > %s AND state = 'intent' "
                               "AND effect = 'mcp:peer/send_money'", (seen,)).fetchone()
            return row[0] if row else None

        try:
            _wait("a send_money intent committed", lambda: fresh_intent() is not None, timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {host.output()[-3000:]}") from None
        seen = int(fresh_intent() or seen)
        time.sleep(rng.uniform(0, SEND_DELAY_S * 1.5))  # inside the call, or just past its answer
        host.kill(signal.SIGKILL)
        host.wait()
        rounds.append(time.monotonic() - t0)
    hosts.start(env)
    for tid in ids.values():
        wait_status(tenant_db, tid, ("done", "blocked"), timeout=60)
    print(f"{KILLS} kills in {time.monotonic() - began:.1f}s, per round p50 "
          f"{sorted(rounds)[len(rounds) // 2]:.2f}s max {max(rounds):.2f}s")

    open_keys = {r.idem_key for r in EffectLedger(conn).open_effects()}
    outcomes = {"done": 0, "blocked": 0}
    for to, tid in ids.items():
        sent = [c for c in mcp_peer.calls("send_money") if c["args"]["to"] == to]
        assert len(sent) <= 1, (to, sent)  # at most once per task, whatever the kill hit
        task = tasks.get(conn, tid)
        assert task is not None
        outcomes[task.status] += 1
        key = idempotency_key(tid, "shop_step", "mcp:peer/send_money")
        effect = conn.execute("SELECT state FROM effects WHERE idem_key = %s", (key,)).fetchone()
        if task.status == "done":
            assert len(sent) == 1 and effect == ("committed",), (to, sent, effect)
        else:  # in doubt: the peer may or may not have it, and a human is asked, never the peer again
            row = conn.execute("SELECT blocked_reason FROM tasks WHERE id = %s", (tid,)).fetchone()
            assert row == ("effect_in_doubt",) and effect == ("blocked",), (to, row, effect)
            assert key in open_keys  # listed for a human (the instance API's open effects)
            assert all(c["meta"][IDEMPOTENCY_META_KEY] == key for c in sent)
    assert outcomes["blocked"] >= KILLS // 3, outcomes  # most kills did land inside the call


def test_a_kill_inside_the_graphs_tools_node_never_sends_twice_and_serves_the_read_from_the_cache(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, mcp_peer: McpPeer, tmp_path: Path) -> None:
    env = _env(tenant_db, tmp_path, mcp_peer)
    hold = tmp_path / "release-the-node"
    tid = tasks.submit(conn, "mcp-graph", {"order": "o-7", "hold_file": str(hold)})
    ledger = TenantCheckpointer(conn).ledger
    graph_task = thread_task_id(str(tid))

    def sent() -> list[tuple[str, str, str]]:
        return [(r.effect, r.state, r.step) for r in ledger.for_task(graph_task)]

    host = hosts.start(env)
    try:
        _wait("send_money committed", lambda: [s[:2] for s in sent()] == [("mcp:peer/send_money", "committed")])
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {sent()} {host.output()[-3000:]}") from None
    host.kill(signal.SIGKILL)  # inside the tools node, after its effect, before the graph's checkpoint
    host.wait()
    hold.touch()

    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked")) == "done", conn.execute(
        "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert len(mcp_peer.calls("send_money")) == 1  # the ledger answered the re-run node
    assert len(mcp_peer.calls("lookup_order")) == 1  # the cache answered it
    assert len(mcp_peer.calls("upsert_contact")) == 2  # idempotent: called again
    effects = sent()
    assert [e[:2] for e in effects] == [("mcp:peer/send_money", "committed")]
    assert effects[0][2].startswith("lg|")  # keyed by the graph's logical step, not the SDK step's ordinal
    store = CheckpointStore(conn)
    out = store.case_file(store.latest(tid)).steps_done["converse"]
    assert out["offered"] == ["lookup_order", "send_money", "upsert_contact"]
    assert out["tools"]["c3"]["structuredContent"] == {"transfer": "tr_1", "to": "acct_ada", "amount": 4200}
    assert out["tools"]["c1"]["structuredContent"]["served"] == 1


def test_reads_and_the_tool_list_reuse_one_open_session_across_tasks_and_a_server_restart(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port for the peer, so that it can come back on the same address
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "mcp-calls.jsonl"
    peer = start_mcp_peer(tmp_path, log, MCP_PEER_PORT=str(port))
    try:
        env = _env(tenant_db, tmp_path, peer)
        hosts.start(env)
        for order in ("o-1", "o-2"):  # distinct arguments: each a real call, not a cached output
            tid = tasks.submit(conn, "mcp-read", {"order": order})
            assert wait_status(tenant_db, tid, ("done", "blocked")) == "done", conn.execute(
                "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
        # Two tasks, two reads, two kinds looked up: one session opened, the tool list asked for once.
        assert [peer.sessions(), len(peer.calls("_tools/list")), len(peer.calls("lookup_order"))] == [1, 1, 2]

        peer.proc.stop()  # the open session's connection is gone with the server
        peer = start_mcp_peer(tmp_path, log, MCP_PEER_PORT=str(port))
        tid = tasks.submit(conn, "mcp-read", {"order": "o-3"})
        assert wait_status(tenant_db, tid, ("done", "blocked")) == "done", conn.execute(
            "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
        # The protocol's session is stateless over HTTP: the open one carries on over a new connection, its tool
        # list still fresh (a session that fails a read is dropped and the read made on a new one).
        assert [peer.sessions(), len(peer.calls("_tools/list")), len(peer.calls("lookup_order"))] == [1, 1, 3]
    finally:
        peer.proc.stop()


def test_a_stdio_server_shipped_inside_the_release_is_spawned_by_the_host_and_routed_like_any(
        tenant_db: TenantDB, conn: psycopg.Connection, hosts: HostRunner, tmp_path: Path) -> None:
    log = tmp_path / "stdio-calls.jsonl"
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, PYTHONPATH=_pythonpath(), MCP_STDIO_CALL_LOG=str(log))
    tid = tasks.submit(conn, "mcp-stdio", {"order": "o-s"})
    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked"), timeout=60) == "done", conn.execute(
        "SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    store = CheckpointStore(conn)
    out = store.case_file(store.latest(tid)).steps_done["bundled"]
    assert out["offered"] == ["lookup_order", "send_money", "upsert_contact"]
    assert out["order"]["order_id"] == "o-s" and out["paid"]["transfer"] == "tr_1"
    calls = [json.loads(line)["tool"] for line in log.read_text().splitlines()]
    assert calls == ["lookup_order", "send_money", "upsert_contact"]  # each received once, by the spawned server
    assert _effects(conn, tid) == [("mcp:bundled/send_money", "committed")]  # destructive: through the ledger
