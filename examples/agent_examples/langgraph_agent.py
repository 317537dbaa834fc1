"""A LangGraph agent inside agent-host, through the SDK: one durable step runs the graph with our checkpointer.

The graph is a plain LangGraph `StateGraph` (messages reducer, an LLM-shaped `agent` node, a `ToolNode`).
The only lines that know about the runtime: `TenantCheckpointer.from_context(ctx)` passed to `compile()`, and
the payment tool calling `effect("payment", ...)` (the instance's configured provider, AGENT_PAYMENTS_URL),
so a crash, a retry or a time travel replays a committed charge instead of charging again.

Task parameters: `turns` (user requests, default 3), `amount` (cents, default 100; turn i pays amount + i),
`node_sleep_s` (simulated model latency per node, capped at 2 s). The graph's thread is the task id: after a
restart the step reads the thread back, finishes an interrupted turn and goes on with the next one.

LangGraph is imported by the step, not by this module: the host loads every agent it runs at boot, and an instance
that is idle (most of them, most of the time) would otherwise carry LangGraph's ~50 MiB for nothing
(docs/runtime.md, "Idle instances").
"""

from __future__ import annotations

import time
from typing import Annotated, Any, TypedDict

from agent_runtime.sdk import Agent, Context

__all__ = ["agent", "build_graph"]

agent = Agent("langgraph", description="A LangGraph StateGraph with a payment tool, checkpointed in the tenant "
                                       "schema, its payments through the effect ledger")


def _add_messages(left: Any, right: Any) -> Any:
    """LangGraph's messages reducer, imported when the graph first runs (the annotation below names it)."""
    from langgraph.graph.message import add_messages

    return add_messages(left, right)


class ChatState(TypedDict):
    messages: Annotated[list[Any], _add_messages]  # langchain_core's AnyMessage


def pay(amount: int, to: str, turn: int) -> str:
    """Charge `amount` cents to `to` for the request of `turn`."""
    from agent_runtime.integrations.langgraph import effect

    charge = effect("payment", {"amount": amount, "to": to, "turn": turn})
    return f"charged {amount} to {to}: {charge.get('id')}"


def build_graph(checkpointer: Any, node_sleep_s: float = 0.0) -> Any:
    """The graph: the agent asks for one payment per user request, then confirms it."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    def model(state: ChatState) -> dict[str, Any]:
        time.sleep(node_sleep_s)  # where a model call would be
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            turn, amount = (int(x) for x in str(last.content).split()[1:3])
            call = {"name": "pay", "args": {"amount": amount, "to": "acme", "turn": turn}, "id": f"pay-{turn}"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        assert isinstance(last, ToolMessage)
        return {"messages": [AIMessage(f"done: {last.content}")]}

    def slow_tools(state: ChatState) -> dict[str, Any]:
        time.sleep(node_sleep_s)
        return dict(tools.invoke(state))

    tools = ToolNode([tool(pay)], handle_tool_errors=False)
    builder = StateGraph(ChatState)
    builder.add_node("agent", model)
    builder.add_node("tools", slow_tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


# One step holds the whole conversation and resumes inside it from the graph's own checkpoints: an attempt
# cut short by a crash loses at most the node that was running, so crashes are not a reason to give up.
@agent.step(timeout_s=120, max_attempts=100)
def converse(ctx: Context) -> dict[str, Any]:
    """Run the remaining user requests through the graph, one invocation per request."""
    from langchain_core.messages import AIMessage, HumanMessage

    from agent_runtime.integrations.langgraph import TenantCheckpointer

    turns = int(ctx.params.get("turns", 3))
    amount = int(ctx.params.get("amount", 100))
    graph = build_graph(TenantCheckpointer.from_context(ctx), min(2.0, float(ctx.params.get("node_sleep_s", 0))))
    config = {"configurable": {"thread_id": ctx.task_id}}
    if graph.get_state(config).created_at is not None:
        # LangGraph's resume: from the thread's latest checkpoint, apply the writes of tasks that finished and
        # run those that did not (a no-op when the last turn completed). `state.next` alone would miss a turn
        # whose tasks all wrote before the crash but whose next checkpoint was never stored.
        graph.invoke(None, config)
    done = sum(isinstance(m, HumanMessage) for m in graph.get_state(config).values.get("messages", []))
    for turn in range(done, turns):
        graph.invoke({"messages": [HumanMessage(f"pay {turn} {amount + turn} to acme")]}, config)
        ctx.progress({"turn": turn})
    messages = graph.get_state(config).values["messages"]
    return {"turns": turns, "answers": [m.content for m in messages if isinstance(m, AIMessage) and m.content]}
