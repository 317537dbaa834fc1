"""Agents for the MCP tests (AGENT_APP=tests.runtime.mcp_agents:AGENTS): one step calls the peer's three tools,
one of each kind, then (with `hold_file`) waits for the test before its checkpoint; the next describes the tools
as a chat model would get them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agent_runtime.sdk import Agent, Context

shop = Agent("mcp-shop")


@shop.step(timeout_s=120)
def shop_step(ctx: Context) -> dict[str, Any]:
    peer = ctx.mcp("peer")
    order = peer.call("lookup_order", {"order_id": ctx.params["order"]})
    contact = peer.call("upsert_contact", {"email": "ada@example.com", "name": "Ada"})
    paid = peer.call("send_money", {"to": ctx.params.get("to", "acct_ada"), "amount": 4200,
                                    "delay_s": float(ctx.params.get("delay_s", 0))})
    hold = ctx.params.get("hold_file")
    while hold and not Path(hold).exists():  # the test kills the host here: after the effect, before the checkpoint
        ctx.progress()
        time.sleep(0.05)
    return {"order": order["structuredContent"], "contact": contact["structuredContent"],
            "paid": paid["structuredContent"]}


@shop.step
def describe(ctx: Context) -> dict[str, Any]:
    peer = ctx.mcp("peer")
    return {"tools": peer.tools(), "kinds": {t: peer.kind(t) for t in ("lookup_order", "upsert_contact",
                                                                        "send_money")}}


AGENTS = {"mcp-shop": shop}


# The same three tools as LangChain tools inside a LangGraph graph (agent_runtime.integrations.langgraph.mcp_tools):
# the "model" asks for all three at once, a tools node runs them in order, then (with `hold_file`) waits for the
# test inside that node, so a kill there re-runs the node on the graph's checkpoint.
graph_agent = Agent("mcp-graph")


def _build_graph(ctx: Context) -> Any:
    # LangGraph is imported here, not at the top: the other agents' hosts boot without it (about a second each
    # on a loaded machine, which the 30-kill test pays per round).
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    from agent_runtime.integrations.langgraph import TenantCheckpointer, mcp_tools

    # The functional form: its annotation is an object, not a string LangGraph would resolve in module globals.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    tools = {t.name: t for t in mcp_tools(ctx.mcp("peer"))}
    hold = ctx.params.get("hold_file")

    def model(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            calls = [{"name": "lookup_order", "args": {"order_id": ctx.params["order"]}, "id": "c1"},
                     {"name": "upsert_contact", "args": {"email": "ada@example.com", "name": "Ada"}, "id": "c2"},
                     {"name": "send_money", "args": {"to": "acct_ada", "amount": 4200}, "id": "c3"}]
            return {"messages": [AIMessage("", tool_calls=calls)]}
        return {"messages": [AIMessage("done")]}

    def run_tools(state: State) -> dict[str, Any]:
        asked = state["messages"][-1]
        assert isinstance(asked, AIMessage)
        out = [ToolMessage(json.dumps(tools[c["name"]].invoke(c["args"])), tool_call_id=c["id"])
               for c in asked.tool_calls]
        while hold and not Path(hold).exists():  # the test kills the host here, inside the node
            time.sleep(0.05)
        return {"messages": out}

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", run_tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=TenantCheckpointer.from_context(ctx))


@graph_agent.step(timeout_s=120, max_attempts=20)
def converse(ctx: Context) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage, ToolMessage

    graph = _build_graph(ctx)
    config = {"configurable": {"thread_id": ctx.task_id}}
    if graph.get_state(config).created_at is not None:
        graph.invoke(None, config)
    else:
        graph.invoke({"messages": [HumanMessage("go")]}, config)
    messages = graph.get_state(config).values["messages"]
    return {"tools": {m.tool_call_id: json.loads(m.content) for m in messages if isinstance(m, ToolMessage)},
            "offered": sorted(t["name"] for t in ctx.mcp("peer").described())}


AGENTS["mcp-graph"] = graph_agent

# A stdio server shipped inside the release (here: the peer's module), spawned by the host for each session.
stdio_agent = Agent("mcp-stdio", mcp_servers={"bundled": {
    "module": "agent_examples.peers.crm",
    "args": ["--stdio", "--call-log", os.environ.get("MCP_STDIO_CALL_LOG", "mcp-stdio-calls.jsonl")]}})


@stdio_agent.step
def bundled(ctx: Context) -> dict[str, Any]:
    server = ctx.mcp("bundled")
    return {"offered": sorted(t["function"]["name"] for t in server.tools()),
            "order": server.call("lookup_order", {"order_id": ctx.params["order"]})["structuredContent"],
            "paid": server.call("send_money", {"to": "acct_ada", "amount": 7})["structuredContent"],
            "env": server.call("upsert_contact", {"email": "e@example.com", "name": "E"})["structuredContent"]}


AGENTS["mcp-stdio"] = stdio_agent

# One read-only call and nothing else: what the cache serves (or refuses to) under the credential's version.
reader = Agent("mcp-read")


@reader.step
def read(ctx: Context) -> dict[str, Any]:
    return ctx.mcp("peer").call("lookup_order", {"order_id": ctx.params["order"]})["structuredContent"]


AGENTS["mcp-read"] = reader
