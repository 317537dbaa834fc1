"""Retention with LangGraph's `DeltaChannel` (beta): its value lives in the pending writes of earlier checkpoints
back to a snapshot, so `prune(keep_latest)` must keep those ancestors. Pruned, then resumed in a new saver (a new
process), the thread has its whole state and goes on from it."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.channels import DeltaChannel
from langgraph.graph import START, StateGraph

from agent_runtime.integrations.langgraph import TenantCheckpointer


def _extend(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    out = list(state)
    for items in writes:
        out.extend(items)
    return out


class _Log(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=5)]


def _graph(saver: TenantCheckpointer) -> Any:
    def node(state: _Log) -> dict[str, Any]:
        return {"items": [f"seen {len(state['items'])}"]}

    builder = StateGraph(_Log)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    return builder.compile(checkpointer=saver)


def _expected(turns: int) -> list[Any]:
    out: list[Any] = []
    for i in range(turns):
        out.append(f"u{i}")
        out.append(f"seen {len(out)}")
    return out


CFG = {"configurable": {"thread_id": "t-delta"}}


def test_prune_keep_latest_then_resume_a_delta_backed_thread(conn: psycopg.Connection) -> None:
    graph = _graph(TenantCheckpointer(conn))
    for i in range(7):  # snapshots every 5 updates: the latest checkpoint is mid-way between two
        graph.invoke({"items": [f"u{i}"]}, CFG)
    assert graph.get_state(CFG).values["items"] == _expected(7)
    before = conn.execute("SELECT count(*) FROM lg_checkpoints WHERE thread_id = 't-delta'").fetchone()

    TenantCheckpointer(conn).prune(["t-delta"], strategy="keep_latest")

    resumed = _graph(TenantCheckpointer(conn))
    assert resumed.get_state(CFG).values["items"] == _expected(7)
    after = conn.execute("SELECT count(*) FROM lg_checkpoints WHERE thread_id = 't-delta'").fetchone()
    assert before is not None and after is not None and 1 < after[0] < before[0]  # pruned, ancestors kept
    resumed.invoke({"items": ["u7"]}, CFG)
    assert _graph(TenantCheckpointer(conn)).get_state(CFG).values["items"] == _expected(8)


def test_retention_on_the_checkpointer_keeps_a_delta_thread_whole(conn: psycopg.Connection) -> None:
    graph = _graph(TenantCheckpointer(conn, keep_latest=1, prune_every=3))  # pruned every third put
    for i in range(20):
        graph.invoke({"items": [f"u{i}"]}, CFG)
    assert _graph(TenantCheckpointer(conn)).get_state(CFG).values["items"] == _expected(20)
    kept = conn.execute("SELECT count(*) FROM lg_checkpoints WHERE thread_id = 't-delta'").fetchone()
    assert kept is not None and kept[0] <= 20  # 60 were written: retention still bounds the thread
