"""What a TenantCheckpointer read costs in rows, counted at the psycopg level (a cursor class on the connection that
records every statement and the rows it returned; nothing of ours is patched): a cold read fetches exactly the
channel versions the checkpoint names and the delta bases under them, never the channels' whole history; a warm
saver's next turn fetches no value at all; list values are stored whole again every `keyframe_every` versions, so
a cold read's delta chain stays short however long the conversation."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agent_runtime.errors import CorruptState
from agent_runtime.integrations.langgraph import TenantCheckpointer
from agent_runtime.state.graph_checkpoints import _blob_checksum


class _CountingCursor(psycopg.Cursor[Any]):
    """Records (statement, rows returned) for every execute on the connection it is installed on."""

    log: list[tuple[str, int]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _CountingCursor:  # type: ignore[override]
        super().execute(query, params, **kwargs)
        text = query if isinstance(query, str) else query.as_string(self.connection)
        type(self).log.append((text, max(self.rowcount, 0)))
        return self


def _blob_rows_read(log: list[tuple[str, int]]) -> int:
    return sum(n for text, n in log if "lg_blobs" in text)


class _Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _graph(saver: TenantCheckpointer) -> Any:
    """LLM-shaped node, a 'tool' node and back: four checkpoints and trigger channels written every turn."""

    def llm(state: _Chat) -> dict[str, Any]:
        last = state["messages"][-1]
        text = "checking" if isinstance(last, HumanMessage) else f"done: {last.content}"
        return {"messages": [AIMessage(text)]}

    def tool(state: _Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(f"result for {len(state['messages'])}")]}

    builder = StateGraph(_Chat)
    builder.add_node("llm", llm)
    builder.add_node("tool", tool)
    builder.add_edge(START, "llm")
    builder.add_conditional_edges("llm", lambda s: "tool" if s["messages"][-1].content == "checking" else END,
                                  ["tool", END])
    builder.add_edge("tool", "llm")
    return builder.compile(checkpointer=saver)


def _talk(graph: Any, thread: str, turns: int) -> None:
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(f"question {i}")]}, {"configurable": {"thread_id": thread}})


def _needed_rows(conn: psycopg.Connection, thread: str) -> tuple[int, int, int]:
    """(rows the latest checkpoint needs, rows the thread has, longest delta chain) -- computed here from the
    whole table, independently of the saver's query."""
    (versions,) = conn.execute("SELECT versions FROM lg_checkpoints WHERE thread_id = %s"
                               " ORDER BY checkpoint_id DESC LIMIT 1", (thread,)).fetchone() or (None,)
    bases = {(c, v): b for c, v, b in conn.execute(
        "SELECT channel, version, base_version FROM lg_blobs WHERE thread_id = %s", (thread,)).fetchall()}
    needed = 0
    for channel, version in versions.items():
        key: tuple[str, str] | None = (channel, str(version))
        while key is not None and key in bases:
            needed += 1
            base = bases[key]
            key = (channel, base) if base is not None else None
    longest = 0
    for channel, version in bases:
        depth, base = 0, bases[(channel, version)]
        while base is not None:
            depth, base = depth + 1, bases[(channel, base)]
        longest = max(longest, depth)
    return needed, len(bases), longest


@pytest.fixture
def counted(conn: psycopg.Connection) -> list[tuple[str, int]]:
    log: list[tuple[str, int]] = []
    _CountingCursor.log = log
    conn.cursor_factory = _CountingCursor
    return log


def test_a_cold_read_fetches_only_the_versions_the_checkpoint_needs(conn: psycopg.Connection,
                                                                    counted: list[tuple[str, int]]) -> None:
    _talk(_graph(TenantCheckpointer(conn, keyframe_every=8)), "t-cold", 20)
    needed, total, longest = _needed_rows(conn, "t-cold")
    # 20 turns x 4 checkpoints: the trigger channels alone have dozens of versions; the checkpoint needs one
    # of each, plus the messages' chain down to its last keyframe.
    assert longest <= 8 and needed <= 4 + 8 and total > 5 * needed, (needed, total, longest)

    counted.clear()
    state = _graph(TenantCheckpointer(conn, keyframe_every=8)).get_state({"configurable": {"thread_id": "t-cold"}})
    assert len(state.values["messages"]) == 4 * 20
    assert [m.content for m in state.values["messages"][-4:]] == [
        "question 19", "checking", "result for 78", "done: result for 78"]
    assert _blob_rows_read(counted) == needed, counted


def test_the_next_turn_of_a_running_saver_reads_no_value(conn: psycopg.Connection,
                                                         counted: list[tuple[str, int]]) -> None:
    saver = TenantCheckpointer(conn)
    graph = _graph(saver)
    _talk(graph, "t-warm", 3)
    counted.clear()
    # What LangGraph does at the start of a turn: read the latest checkpoint. Everything it names was written
    # by this saver, the consumed (empty) trigger channels included, so no value is fetched.
    tup = saver.get_tuple({"configurable": {"thread_id": "t-warm"}})
    assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == 12
    assert not [text for text, _n in counted if "lg_blobs" in text], counted
    _talk(graph, "t-warm", 1)
    assert _blob_rows_read(counted) == 0, counted


def test_lists_are_keyframed_and_a_new_saver_continues_the_chain_bound(conn: psycopg.Connection) -> None:
    _talk(_graph(TenantCheckpointer(conn, keyframe_every=3)), "t-key", 4)
    # A new process continues the thread: it learns the depth of the base it extends from the rows it reads.
    graph = _graph(TenantCheckpointer(conn, keyframe_every=3))
    _talk(graph, "t-key", 4)
    _needed, _total, longest = _needed_rows(conn, "t-key")
    assert longest == 3
    full = conn.execute("SELECT count(*) FROM lg_blobs WHERE thread_id = 't-key' AND channel = 'messages'"
                        " AND base_version IS NULL").fetchone()
    assert full is not None and full[0] == 8  # 32 versions: one full value and three deltas, eight times
    fresh = _graph(TenantCheckpointer(conn)).get_state({"configurable": {"thread_id": "t-key"}})
    assert [m.content for m in fresh.values["messages"]] == [m.content for m in graph.get_state(
        {"configurable": {"thread_id": "t-key"}}).values["messages"]]
    assert len(fresh.values["messages"]) == 32


def test_delta_bases_that_loop_are_refused_not_followed_forever(conn: psycopg.Connection) -> None:
    """Someone with write access to the schema re-points the bottom of a chain at its top and recomputes the
    row's checksum (it is not a MAC): the walk, in SQL and in Python, must end in CorruptState."""
    _talk(_graph(TenantCheckpointer(conn)), "t-loop", 2)
    top = conn.execute("SELECT versions->>'messages' FROM lg_checkpoints WHERE thread_id = 't-loop'"
                       " ORDER BY checkpoint_id DESC LIMIT 1").fetchone()
    bottom = conn.execute("SELECT version, type, data FROM lg_blobs WHERE thread_id = 't-loop'"
                          " AND channel = 'messages' AND base_version IS NULL").fetchone()
    assert top is not None and bottom is not None
    version, type_, data = bottom
    conn.execute("UPDATE lg_blobs SET base_version = %s, prefix_len = 0, checksum = %s WHERE thread_id = 't-loop'"
                 " AND channel = 'messages' AND version = %s",
                 (top[0], _blob_checksum("t-loop", "", "messages", version, type_, top[0], 0, bytes(data)), version))
    conn.execute("SET statement_timeout = '20s'")  # a query that followed the loop would fail, not hang
    with pytest.raises(CorruptState, match="loop"):
        _graph(TenantCheckpointer(conn)).get_state({"configurable": {"thread_id": "t-loop"}})


def test_a_keyframe_is_compressed_with_lz4_and_read_in_binary(conn: psycopg.Connection,
                                                              counted: list[tuple[str, int]]) -> None:
    """The two costs a cold read of a long thread paid beyond decoding its messages: the server's pglz (3.0 ms to
    insert a 0.5 MB keyframe, lz4 0.4 ms) and bytea sent as hex text (twice the bytes, decoded back by psycopg)."""
    (server,) = conn.execute("SHOW server_version_num").fetchone() or (0,)
    _talk(_graph(TenantCheckpointer(conn, keyframe_every=4)), "t-lz4", 40)  # keyframes of >100 messages
    row = conn.execute("SELECT pg_column_compression(data), length(data), pg_column_size(data) FROM lg_blobs"
                       " WHERE thread_id = 't-lz4' AND channel = 'messages' AND base_version IS NULL"
                       " ORDER BY length(data) DESC LIMIT 1").fetchone()
    assert row is not None and row[1] > 8192 and row[2] < row[1], row  # large enough to be compressed, and it was
    if int(server) >= 140000:
        built_with_lz4 = True
        try:
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE probe_lz4 (b bytea COMPRESSION lz4) ON COMMIT DROP")
        except psycopg.errors.FeatureNotSupported:
            built_with_lz4 = False
        assert row[0] == ("lz4" if built_with_lz4 else "pglz"), row

    class _Formats(_CountingCursor):
        formats: list[int] = []

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _Formats:  # type: ignore[override]
            super().execute(query, params, **kwargs)
            if self.pgresult is not None and self.pgresult.nfields:
                type(self).formats.append(self.pgresult.fformat(0))
            return self

    conn.cursor_factory = _Formats
    state = _graph(TenantCheckpointer(conn)).get_state({"configurable": {"thread_id": "t-lz4"}})
    assert len(state.values["messages"]) == 160
    assert _Formats.formats and set(_Formats.formats) == {1}, _Formats.formats  # every read: binary results


class _CountingSerde(JsonPlusSerializer):
    """LangGraph's serde, recording the length of every list it serialises."""

    def __init__(self) -> None:
        super().__init__()
        self.list_lengths: list[int] = []

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if isinstance(obj, list):
            self.list_lengths.append(len(obj))
        return super().dumps_typed(obj)


def test_a_running_saver_joins_keyframes_from_bytes_it_wrote(conn: psycopg.Connection) -> None:
    """A keyframe is the run's bytes under a new header, byte for byte what serialising the list gives, and a
    saver never serialises the whole history again, a new one continuing the thread neither."""
    serde = _CountingSerde()
    graph = _graph(TenantCheckpointer(conn, keyframe_every=3, serde=serde))
    _talk(graph, "t-join", 6)
    assert max(serde.list_lengths) <= 2, serde.list_lengths  # the new items of a version, never the history
    fresh_serde = _CountingSerde()  # a new process continuing the thread joins from the rows it read
    _talk(_graph(TenantCheckpointer(conn, keyframe_every=3, serde=fresh_serde)), "t-join", 4)
    assert max(fresh_serde.list_lengths) <= 2, fresh_serde.list_lengths
    rows = conn.execute("SELECT type, data FROM lg_blobs WHERE thread_id = 't-join' AND channel = 'messages'"
                        " AND base_version IS NULL ORDER BY version").fetchall()
    assert len(rows) == 10  # 40 versions: a keyframe and three deltas each
    for type_, data in rows:
        assert type_ == "msgpack"
        assert serde.dumps_typed(serde.loads_typed((type_, data))) == (type_, data)
    state = _graph(TenantCheckpointer(conn)).get_state({"configurable": {"thread_id": "t-join"}})
    assert [m.content for m in state.values["messages"]][-4:] == [
        "question 3", "checking", "result for 38", "done: result for 38"]
    assert len(state.values["messages"]) == 40
