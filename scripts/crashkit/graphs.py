"""The LangGraph graphs of the kit, each built twice from the same code: with a plain tool on `PostgresSaver`
(what a LangGraph user has today) and with `effect()`/`durable_effect` on `TenantCheckpointer` (ours).

Both sides charge the same payments peer (de-duplication off: a provider that ignores Idempotency-Key), so
what the peer counts is what each side did. A plain tool sends a fresh Idempotency-Key per call, as a tool
that does not know about replays does. No assertions here: the attacks count.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy, interrupt
from psycopg.rows import dict_row

from agent_runtime.db import connect
from agent_runtime.effects.config import adapter_from_spec, payments_api_spec
from agent_runtime.integrations.langgraph import TenantCheckpointer, durable_effect, effect
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore

__all__ = ["ChatState", "durable_pay_tool", "item_chargers", "loop_graph", "our_saver", "payment_graph",
           "plain_async_saver", "plain_pay_tool", "plain_saver"]

ANCHOR_SCHEMA = "lg_anchor"


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class LoopState(TypedDict, total=False):
    items: list[int]
    charged: list[str]


def _post_charge(payments_url: str, amount: int, to: str, idem_key: str, timeout_s: float = 10.0) -> dict[str, Any]:
    req = urllib.request.Request(f"{payments_url}/v1/charges", method="POST",  # noqa: S310 - the local peer
                                 data=json.dumps({"amount": amount, "to": to,
                                                  "metadata": {"idempotency_key": idem_key}}).encode(),
                                 headers={"Content-Type": "application/json", "Idempotency-Key": idem_key})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
        return dict(json.loads(resp.read()))


def plain_pay_tool(payments_url: str, receipt_s: float = 0.0) -> BaseTool:
    @tool
    def pay(amount: int, to: str) -> str:
        """Charge `amount` cents to `to` (a plain tool: one request per call), then file the receipt."""
        charge = _post_charge(payments_url, amount, to, str(uuid.uuid4()))
        time.sleep(receipt_s)  # the rest of a long tool call
        return str(charge["id"])

    return pay  # type: ignore[no-any-return]


def durable_pay_tool(receipt_s: float = 0.0) -> BaseTool:
    @tool("pay")
    def pay(amount: int, to: str) -> str:
        """Charge `amount` cents to `to` through the tenant's effect ledger, then file the receipt."""
        charge = effect("payment", {"amount": amount, "to": to})
        time.sleep(receipt_s)
        return str(charge["id"])

    return pay  # type: ignore[no-any-return]


def payment_graph(pay: BaseTool, checkpointer: BaseCheckpointSaver[Any], *, interrupt_before: list[str] | None = None,
                  tools_timeout_s: float | None = None, retry: RetryPolicy | None = None) -> Any:
    """An agent that asks for one payment tool call, then answers; the tool node runs the payment."""

    def agent(state: ChatState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], HumanMessage):
            call = {"name": "pay", "args": {"amount": 4200, "to": "acme"}, "id": "call-pay-1"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [AIMessage(f"done: {state['messages'][-1].content}")]}

    builder = StateGraph(ChatState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([pay], handle_tool_errors=False), timeout=tools_timeout_s, retry_policy=retry)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer, interrupt_before=interrupt_before)


def item_chargers(payments_url: str) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """(plain, durable) ways to charge one item of a batch."""

    def plain(amount: int) -> str:
        return str(_post_charge(payments_url, amount, "acme", str(uuid.uuid4()))["id"])

    @durable_effect("payment_item")
    def charge_item(idem_key: str, amount: int, to: str) -> dict[str, Any]:
        return _post_charge(payments_url, amount, to, idem_key)

    def durable(amount: int) -> str:
        return str(charge_item(amount=amount, to="acme")["id"])

    return plain, durable


def loop_graph(charge: Callable[[int], str], checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """One node that charges each item of a batch and asks a human after each charge (`interrupt()` in a loop):
    on every resume LangGraph runs the node body again from its first line."""

    def charge_each(state: LoopState) -> LoopState:
        charged = []
        for amount in state["items"]:
            charged.append(charge(amount))
            interrupt({"charged": amount, "question": "charge the next one?"})
        return {"charged": charged}

    builder = StateGraph(LoopState)
    builder.add_node("charge_each", charge_each)
    builder.add_edge(START, "charge_each")
    builder.add_edge("charge_each", END)
    return builder.compile(checkpointer=checkpointer)


def plain_saver(dsn: str) -> tuple[PostgresSaver, psycopg.Connection[Any]]:
    """LangGraph's PostgresSaver on the same database, as the tenant role, in a schema of its own."""
    conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                                                    options=f"-c search_path={ANCHOR_SCHEMA}")
    saver = PostgresSaver(conn)  # type: ignore[arg-type]
    saver.setup()
    return saver, conn


async def plain_async_saver(dsn: str) -> tuple[Any, psycopg.AsyncConnection[Any]]:
    """The same for `ainvoke` (PostgresSaver is sync only): AsyncPostgresSaver."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-c search_path={ANCHOR_SCHEMA}")
    saver = AsyncPostgresSaver(conn)  # type: ignore[arg-type]
    await saver.setup()
    return saver, conn


def our_saver(dsn: str, schema: str, objects_dir: str, object_key: bytes, tenant_id: str, payments_url: str,
              **adapter_options: Any) -> tuple[TenantCheckpointer, psycopg.Connection[Any]]:
    """TenantCheckpointer on the tenant schema, its encrypted object store, and the payments peer as the
    instance's `payment` provider (Stripe-style: looked up by the key kept in metadata)."""
    conn = connect(dsn, schema, autocommit=True)
    store = EncryptedObjectStore(FileObjectStore(Path(objects_dir)), object_key, tenant_id)
    adapter = adapter_from_spec("payment", {**payments_api_spec(payments_url), **adapter_options}, None)
    return TenantCheckpointer(conn, objects=store, tenant_id=tenant_id, effects={"payment": adapter}), conn


def human(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}
