"""Retention with LangGraph's `DeltaChannel` (beta): its value lives in the pending writes of earlier checkpoints
back to a snapshot, so `prune(keep_latest)` must keep those ancestors. Pruned, then resumed in a new saver (a new
process), the thread has its whole state and goes on from it."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph

from agent_runtime.errors import CorruptState
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


class _Two(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=5)]
    notes: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=3)]


def _two(saver: TenantCheckpointer) -> Any:
    def first(state: _Two) -> dict[str, Any]:
        return {"items": [f"a{len(state['items'])}"]}

    def second(state: _Two) -> dict[str, Any]:
        return {"items": [f"b{len(state['items'])}"], "notes": [f"n{len(state['notes'])}"]}

    builder = StateGraph(_Two)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    return builder.compile(checkpointer=saver)


class _DefaultWalk(TenantCheckpointer):
    """LangGraph's own `get_delta_channel_history` (a `get_tuple` per ancestor) on our storage: the reference."""

    get_delta_channel_history = BaseCheckpointSaver.get_delta_channel_history  # type: ignore[assignment]


def test_delta_history_is_langgraphs_own_in_one_statement(conn: psycopg.Connection) -> None:
    """Our `get_delta_channel_history` (one walk in SQL) against LangGraph's default (a `get_tuple` per ancestor) on
    every checkpoint of a thread with two delta channels snapshotting at different rates and a time-travel fork:
    the same seeds and writes, in the same order; and a cold read of a deep checkpoint costs a bounded number of
    statements, not one per ancestor."""
    saver = TenantCheckpointer(conn)
    graph = _two(saver)
    two = {"configurable": {"thread_id": "t-two"}}
    for i in range(6):
        graph.invoke({"items": [f"u{i}"], "notes": []}, two)
    history = list(saver.list(two))
    fork_from = history[len(history) // 2].config
    graph.invoke({"items": ["forked"], "notes": ["f"]}, fork_from)  # a branch off the middle of the thread
    channels = ["items", "notes"]
    checked = 0
    for tup in saver.list(two):
        ours = saver.get_delta_channel_history(config=tup.config, channels=channels)
        theirs = BaseCheckpointSaver.get_delta_channel_history(saver, config=tup.config, channels=channels)
        assert ours == theirs, tup.config
        checked += 1
    assert checked > 20
    seeded = [h for h in (saver.get_delta_channel_history(config=t.config, channels=channels)
                          for t in saver.list(two)) if "seed" in h["items"] and h["items"]["writes"]]
    assert seeded, "no checkpoint replays writes on top of a snapshot: the test would not test the walk"

    log: list[tuple[str, int]] = []

    class Counting(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Counting:  # type: ignore[override]
            log.append((str(query), 0))
            return super().execute(query, params, **kwargs)

    conn.cursor_factory = Counting
    try:
        state = _two(TenantCheckpointer(conn)).get_state(two)  # a new saver: nothing cached
    finally:
        conn.cursor_factory = psycopg.Cursor
    assert state.values == _two(_DefaultWalk(conn)).get_state(two).values  # the fork's branch, as LangGraph rebuilds it
    assert "forked" in state.values["items"] and len(state.values["notes"]) > 1
    assert len(log) <= 6, [q[:80] for q, _ in log]


def test_a_corrupt_write_in_a_delta_history_is_refused(conn: psycopg.Connection) -> None:
    graph = _graph(TenantCheckpointer(conn))
    for i in range(3):
        graph.invoke({"items": [f"u{i}"]}, CFG)
    conn.execute("UPDATE lg_writes SET data = data || '\\x00'::bytea WHERE thread_id = 't-delta'"
                 " AND channel = 'items' AND checkpoint_id = (SELECT max(checkpoint_id) FROM lg_writes"
                 " WHERE thread_id = 't-delta' AND channel = 'items')")
    with pytest.raises(CorruptState):
        _graph(TenantCheckpointer(conn)).get_state(CFG)


def _extend_in_place(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    for items in writes:
        state.extend(items)
    return state


class _InPlace(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_extend_in_place, snapshot_frequency=5)]


def test_a_reducer_that_extends_its_state_in_place_never_edits_the_saved_snapshot(conn: psycopg.Connection) -> None:
    """The saver keeps values by version in memory; a snapshot handed to a reducer that appends to it in place
    must be a copy, or every later read of that checkpoint would see the writes replayed onto it again. With
    durability 'sync' (PostgresSaver and InMemorySaver get this right); with the default background writes an
    in-place reducer races LangGraph's own writer, PostgresSaver's snapshot too, so that is not asserted."""

    def node(state: _InPlace) -> dict[str, Any]:
        return {"items": [f"seen {len(state['items'])}"]}

    builder = StateGraph(_InPlace)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    graph = builder.compile(checkpointer=TenantCheckpointer(conn))
    for i in range(7):
        graph.invoke({"items": [f"u{i}"]}, CFG, durability="sync")
        assert graph.get_state(CFG).values["items"] == _expected(i + 1)
    assert graph.get_state(CFG).values["items"] == _expected(7)  # the same saver, read again
