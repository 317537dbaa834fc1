"""LangGraph checkpointers on the same database in the same run: PostgresSaver (the anchor) vs TenantCheckpointer.

A real `StateGraph` (messages reducer, an LLM-shaped node, a ToolNode) runs TURNS conversation turns on one
thread with each saver, turn by turn in alternation (who goes first alternating), and the `get_state` samples
alternate the same way, so load on the machine hits both alike. A third graph on LangGraph's InMemorySaver with a
pass-through serde (no serialisation, no I/O) runs in the same rotation: its per-turn growth is LangGraph's and
the `add_messages` reducer's own, the floor a saver's growth is measured against. Printed: per-turn latency (mean of
the first and last 20 turns), storage (tables, indexes and TOAST; ours also counts object-store bytes), and resume
latency (`get_state` p50: warm on the running saver, cold on a new saver instance, i.e. a fresh process). Goal: >=
10x less storage, flat per-turn cost, resume <= 5 ms p50. JSON copy in var/bench/langgraph.json. Env:
BENCH_POSTGRES_URL, BENCH_TURNS (500), BENCH_GET_STATE_N (30), BENCH_CHANNEL: `add_messages` (the default, a
`BinaryOperatorAggregate` storing the whole list at every version) or `delta` (LangGraph's beta `DeltaChannel` with
its messages reducer: a snapshot every 100 updates, the writes in between replayed on read), the graph both savers
run; the JSON then goes to var/bench/langgraph-delta.json.
"""

from __future__ import annotations

import math
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.db import connect  # noqa: E402
from agent_runtime.integrations.langgraph import TenantCheckpointer  # noqa: E402
from agent_runtime.state.migrations import migrate  # noqa: E402
from bench import _run  # noqa: E402

SERVER_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TURNS = _run.size("BENCH_TURNS", 500, smoke=6)
GET_STATE_N = _run.size("BENCH_GET_STATE_N", 30, smoke=3)
EDGE = min(20, TURNS)  # turns averaged at each end: "first-20" and "last-20"
GROWTH_EDGE = min(50, TURNS)  # turns at each end of the growth run, by their median
CHANNEL = os.environ.get("BENCH_CHANNEL", "add_messages")
if CHANNEL not in ("add_messages", "delta"):
    raise SystemExit(f"BENCH_CHANNEL={CHANNEL!r}: 'add_messages' or 'delta'")


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class DeltaChatState(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]


@tool
def order_status(order: int) -> str:
    """Look up an order."""
    return f"order {order}: shipped on day {order % 28 + 1} from warehouse {order % 7}; tracking TRK{order:08d}"


class PassThroughSerde:
    """Keeps the objects as they are: InMemorySaver with it costs a dict insert per value, so what grows with
    the history on that graph is LangGraph's own work (the reducer re-indexing the list), not a saver's."""

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        return "object", obj

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        return data[1]


def build(checkpointer: Any) -> Any:
    def llm(state: dict[str, Any]) -> dict[str, Any]:  # the schema is the builder's (either State)
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            n = int(str(last.content).split()[1].rstrip(":"))
            return {"messages": [AIMessage("Let me check that order for you.", tool_calls=[
                {"name": "order_status", "args": {"order": n}, "id": f"call-{n}"}])]}
        assert isinstance(last, ToolMessage)
        return {"messages": [AIMessage(f"Your order is on its way: {last.content}. Anything else I can do?")]}

    builder = StateGraph(DeltaChatState if CHANNEL == "delta" else ChatState)
    builder.add_node("llm", llm)
    builder.add_node("tools", ToolNode([order_status]))
    builder.add_edge(START, "llm")
    builder.add_conditional_edges("llm", tools_condition)
    builder.add_edge("tools", "llm")
    return builder.compile(checkpointer=checkpointer)


def one_turn(graph: Any, thread: str, i: int) -> float:
    t0 = time.perf_counter()
    graph.invoke({"messages": [HumanMessage(f"order {i}: where is my parcel? It was due last week.")]},
                 {"configurable": {"thread_id": thread}})
    return (time.perf_counter() - t0) * 1000


def one_get_state(graph: Any, thread: str) -> float:
    t0 = time.perf_counter()
    state = graph.get_state({"configurable": {"thread_id": thread}})
    took = (time.perf_counter() - t0) * 1000
    assert len(state.values["messages"]) == 4 * TURNS
    return took


def alternating(runs: dict[str, Callable[[int], float]], n: int) -> dict[str, list[float]]:
    """``n`` samples of each, one of each per round, who goes first alternating from round to round."""
    names = list(runs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names if i % 2 == 0 else names[::-1]:
            out[name].append(runs[name](i))
    return out


def schema_bytes(conn: psycopg.Connection, schema: str) -> int:
    row = conn.cursor(row_factory=tuple_row).execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    dbname = f"lg_bench_{secrets.token_hex(3)}"
    with psycopg.connect(SERVER_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = psycopg.conninfo.make_conninfo(SERVER_URL, dbname=dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE SCHEMA anchor")
            admin.execute("CREATE SCHEMA tenant")
        results: dict[str, Any] = {"turns": TURNS, "channel": CHANNEL}
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                             options="-c search_path=anchor") as pg, connect(dsn, "tenant", autocommit=True) as conn:
            anchor = PostgresSaver(pg)  # type: ignore[arg-type]
            anchor.setup()
            migrate(conn, "tenant")
            ours = TenantCheckpointer(conn)
            graphs = {"postgres_saver": build(anchor), "tenant_checkpointer": build(ours)}
            floor = build(InMemorySaver(serde=PassThroughSerde()))
            # The growth against the floor, on its own and first: in the rotation below PostgresSaver writes ~100 MB
            # (its last turns ~0.4 MB each) on the same server between our turns, and the server absorbing that
            # (WAL, checkpoints) lands on whichever saver's turn comes next, never on the floor, which does no I/O.
            # Here our saver and the floor only, turn by turn, before any of that; compared by medians of
            # GROWTH_EDGE turns at each end, of our turn and of the floor's, so that one spike moves neither.
            try:  # what earlier work left for the server to write out, written before the first turn
                pg.execute("CHECKPOINT")
            except psycopg.errors.InsufficientPrivilege:
                pass
            growth = alternating({"tenant_checkpointer": lambda i: one_turn(graphs["tenant_checkpointer"], "growth", i),
                                  "floor": lambda i: one_turn(floor, "growth", i)}, TURNS)
            results["growth_run"] = {name: {"first_ms": statistics.median(xs[:GROWTH_EDGE]),
                                            "last_ms": statistics.median(xs[-GROWTH_EDGE:])}
                                     for name, xs in growth.items()}
            lat = alternating({**{name: lambda i, g=g: one_turn(g, "bench", i) for name, g in graphs.items()},
                               "floor": lambda i: one_turn(floor, "bench", i)}, TURNS)
            # Medians next to the means: one spike of load in a 20-turn window moves its mean by milliseconds.
            results["median_growth_ms"] = {name: statistics.median(xs[-EDGE:]) - statistics.median(xs[:EDGE])
                                           for name, xs in lat.items()}
            results["floor"] = {"first20_ms": statistics.mean(lat["floor"][:EDGE]),
                                "last20_ms": statistics.mean(lat["floor"][-EDGE:])}
            warm = alternating({name: lambda _i, g=g: one_get_state(g, "bench") for name, g in graphs.items()},
                               GET_STATE_N)
            # Cold: a new saver instance (what a restarted process has), built anew for every sample.
            cold = alternating({
                "postgres_saver": lambda _i: one_get_state(build(PostgresSaver(pg)), "bench"),  # type: ignore[arg-type]
                "tenant_checkpointer": lambda _i: one_get_state(build(TenantCheckpointer(conn)), "bench"),
            }, GET_STATE_N)
            storage = {"postgres_saver": schema_bytes(pg, "anchor"), "tenant_checkpointer": ours.store.storage_bytes()}

            for name in graphs:
                results[name] = {
                    "first20_ms": statistics.mean(lat[name][:EDGE]), "last20_ms": statistics.mean(lat[name][-EDGE:]),
                    "storage_bytes": storage[name], "get_state_p50_ms": statistics.median(warm[name]),
                    "get_state_cold_p50_ms": statistics.median(cold[name])}
    finally:
        with psycopg.connect(SERVER_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    a, o, f = results["postgres_saver"], results["tenant_checkpointer"], results["floor"]
    results["storage_ratio"] = a["storage_bytes"] / o["storage_bytes"]
    print(f"{TURNS} turns, one thread, same database, the two savers turn by turn; messages channel: {CHANNEL}")
    print(f"{'':22}{f'first{EDGE} ms':>11}{f'last{EDGE} ms':>11}{'storage':>12}{'get_state p50':>15}{'cold p50':>10}")
    for name, r in (("PostgresSaver", a), ("TenantCheckpointer", o)):
        print(f"{name:22}{r['first20_ms']:11.2f}{r['last20_ms']:11.2f}{r['storage_bytes'] / 1e6:10.2f}MB"
              f"{r['get_state_p50_ms']:13.2f}ms{r['get_state_cold_p50_ms']:8.2f}ms")
    growth = {name: r["last20_ms"] / r["first20_ms"] for name, r in (("anchor", a), ("ours", o), ("floor", f))}
    print(f"{'floor (in memory)':22}{f['first20_ms']:11.2f}{f['last20_ms']:11.2f}")
    print(f"storage ratio: {results['storage_ratio']:.1f}x less; per-turn growth last{EDGE}/first{EDGE}: "
          f"PostgresSaver {growth['anchor']:.2f}x, ours {growth['ours']:.2f}x, floor {growth['floor']:.2f}x;"
          f" load average {os.getloadavg()[0]:.1f}")
    results["load_average"] = os.getloadavg()[0]
    bench = "langgraph" if CHANNEL == "add_messages" else "langgraph-delta"
    _run.ratio_line(bench, "storage, PostgresSaver / TenantCheckpointer", results["storage_ratio"],
                    "(goal >= 10x)")
    _run.ratio_line(bench, "cold get_state p50, TenantCheckpointer / PostgresSaver",
                    o["get_state_cold_p50_ms"] / a["get_state_cold_p50_ms"],
                    f"(PostgresSaver {a['get_state_cold_p50_ms']:.2f} ms)")
    # Growth in milliseconds, not last/first: the floor's first turns cost a third to a fifth of a saver's, so its
    # multiplicative growth looks steep while adding less time per turn than either saver.
    med = results["median_growth_ms"]
    print(f"per-turn growth in the rotation with PostgresSaver, medians of last{EDGE} - first{EDGE}: PostgresSaver"
          f" {med['postgres_saver']:+.1f} ms, ours {med['tenant_checkpointer']:+.1f} ms, floor {med['floor']:+.1f} ms")
    run = results["growth_run"]
    added = {name: r["last_ms"] - r["first_ms"] for name, r in run.items()}
    results["growth_ms"] = added
    print(f"growth run (ours and the floor only, {TURNS} turns, medians of the first and last {GROWTH_EDGE}): ours"
          f" {run['tenant_checkpointer']['first_ms']:.2f} -> {run['tenant_checkpointer']['last_ms']:.2f} ms"
          f" ({added['tenant_checkpointer']:+.2f}), floor {run['floor']['first_ms']:.2f} ->"
          f" {run['floor']['last_ms']:.2f} ms ({added['floor']:+.2f}); our saver's own growth"
          f" {added['tenant_checkpointer'] - added['floor']:+.2f} ms")
    _run.ratio_line(bench, f"per-turn growth (median of last{GROWTH_EDGE} - first{GROWTH_EDGE} ms, ours and the floor"
                    " alone), TenantCheckpointer / floor",
                    added["tenant_checkpointer"] / added["floor"] if added["floor"] > 0 else math.nan,
                    f"(goal <= 1; floor {added['floor']:+.2f} ms, ours {added['tenant_checkpointer']:+.2f} ms)")
    _run.write_json(bench, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
