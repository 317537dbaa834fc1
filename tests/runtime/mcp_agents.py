"""Agents for the MCP tests (AGENT_APP=tests.runtime.mcp_agents:AGENTS): one step calls the peer's three tools,
one of each kind, then (with `hold_file`) waits for the test before its checkpoint; the next describes the tools
as a chat model would get them."""

from __future__ import annotations

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
