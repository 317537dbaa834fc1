"""`calendar`: uses the customer's own account at a provider, connected through OAuth (docs/connections.md).

The agent declares the provider it needs (`Agent(connections=[...])`): the control plane hands an instance only
the connections its agents declared, and only its own customer's. The step asks for the access token at the
moment of use (`ctx.connections.get(provider).access_token()`: refreshed by the control plane ahead of expiry,
never checkpointed, never logged) and calls the provider's API with it; its result holds what the API said,
never the token.

Agent configuration (AGENT_CONFIG): `calendar_url`, the provider's API (the demo's example OAuth server's
`/resource`); a task's `calendar_url` parameter overrides it. `provider` names the connection (`example-oauth`).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from agent_runtime.sdk import Agent, Context

__all__ = ["PROVIDER", "agent"]

PROVIDER = "example-oauth"

agent = Agent("calendar", description="Reads the customer's calendar at a provider through its connected account "
                                      "(OAuth, refreshed by the control plane).", connections=[PROVIDER])


@agent.step
def read_calendar(ctx: Context) -> Any:
    url = str(ctx.params.get("calendar_url") or ctx.config.get("calendar_url") or "")
    if not url.startswith(("https://", "http://")):
        raise ValueError("no http(s) calendar_url in the task's parameters or the agent configuration")
    connection = ctx.connections.get(PROVIDER)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {connection.access_token()}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - http(s) only
        body = json.loads(answer.read())
    return {"account": body.get("user", ""), "events": [e.get("title", "") for e in body.get("events", [])]}
