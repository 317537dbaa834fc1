"""Memory for many conversations: per-thread windows that never exceed their budget, summaries the host
makes by itself when a thread outgrows it, and no message of any thread ever lost."""

from __future__ import annotations

import time

import psycopg

from agent_runtime.db import connect
from agent_runtime.host.memory_upkeep import extractive_summary, roll_over_threads
from agent_runtime.state import tasks
from agent_runtime.state.memory import MemoryStore, Message, Summary
from agent_runtime.state.migrations import migrate

from .conftest import HostRunner, TenantDB
from .test_host import wait_status


def test_threads_roll_over_separately_and_windows_stay_in_budget(conn: psycopg.Connection) -> None:
    for thread in ("alice", "bob", "quiet"):
        store = MemoryStore(conn, thread)
        for i in range(40 if thread != "quiet" else 3):
            store.append("user" if i % 2 else "assistant", f"{thread} turn {i}: " + "y" * 100)
    seq, rolled = roll_over_threads(conn, 300, extractive_summary, 0)
    assert sorted(rolled) == ["alice", "bob"]  # "quiet" fits its window: left alone
    for thread in ("alice", "bob", "quiet"):
        win = MemoryStore(conn, thread).window(300)
        assert win.tokens <= 300 and not win.needs_rollover
    summary = MemoryStore(conn, "alice").latest_summary()
    assert summary is not None and summary.tokens <= 300 // 4 and "alice turn 0" in summary.content
    assert "bob" not in summary.content  # threads never mix
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 83  # nothing lost from the log
    assert roll_over_threads(conn, 300, extractive_summary, seq) == (seq, [])  # nothing new since


def test_a_summary_larger_than_the_budget_never_overflows_the_window(conn: psycopg.Connection) -> None:
    store = MemoryStore(conn, "t")
    store.append("user", "hello")
    store.add_summary(0, "z" * 40_000)  # e.g. written by an older runtime with a bigger budget
    win = store.window(500)
    assert win.tokens <= 500 and win.summary is not None and win.messages[-1].content == "hello"


def test_the_host_summarizes_with_the_agents_summarizer(tenant_db: TenantDB, host_env: dict,
                                                        hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP="tests.runtime.agents:AGENTS", AGENT_MEMORY_TOKEN_BUDGET="200")
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        migrate(c, tenant_db.schema)
        tid = tasks.submit(c, "chatter", {"threads": ["support-1", "support-2"], "n": 30})
    hosts.start(env)
    assert wait_status(tenant_db, tid, ("done", "blocked", "failed")) == "done"
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        for _ in range(100):
            rows = c.execute("SELECT thread, content FROM summaries ORDER BY thread").fetchall()
            if len(rows) == 2:
                break
            time.sleep(0.05)
        assert [r[0] for r in rows] == ["support-1", "support-2"]
        assert all(r[1].startswith("folded ") for r in rows)  # the agent's own summarizer, called by the host
        assert c.execute("SELECT count(*) FROM messages").fetchone()[0] == 60
        for thread in ("support-1", "support-2"):
            assert MemoryStore(c, thread).window(200).tokens <= 200


def test_rollover_covers_threads_sparse_in_the_global_sequence(conn: psycopg.Connection) -> None:
    """Threads interleave in one global sequence: "b" gets one message for every five of "a" and starts
    only after 600 of "a"; "c" gets one message every 700 seqs. The fold walks each thread's own rows, so
    every dropped message of every thread reaches the summarizer exactly once and the window holds the rest.
    """
    a, b, c = (MemoryStore(conn, t) for t in ("a", "b", "c"))
    with conn.transaction():
        for i in range(600):
            a.append("user", f"a early {i}")
        for i in range(300):
            for j in range(5):
                a.append("user", f"a {i}.{j}")
            b.append("user", f"b {i}")
        for i in range(12):
            c.append("user", f"c {i} " + "x" * 40)
            for j in range(700):
                a.append("assistant", f"a late {i}.{j}")
    seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    calls: dict[str, int] = {"a": 0, "b": 0, "c": 0}

    def counting(previous: Summary | None, messages: list[Message]) -> str:
        thread = messages[0].content.split(" ")[0]
        assert all(m.content.startswith(thread + " ") for m in messages)  # threads never mix
        assert len(messages) <= 500  # bounded batches
        seen[thread].extend(m.seq for m in messages)
        calls[thread] += 1
        return extractive_summary(previous, messages)

    _, rolled = roll_over_threads(conn, 40, counting, 0)
    assert sorted(rolled) == ["a", "b", "c"]
    for thread in ("a", "b", "c"):
        store = MemoryStore(conn, thread)
        summary = store.latest_summary()
        assert summary is not None and calls[thread] >= 1
        seqs = [int(r[0]) for r in conn.execute(
            "SELECT seq FROM messages WHERE thread = %s ORDER BY seq", (thread,)).fetchall()]
        assert seen[thread] == [s for s in seqs if s <= summary.upto_seq]  # each once, in order
        window = store.window(40)
        assert [m.seq for m in window.messages] == [s for s in seqs if s > summary.upto_seq]
