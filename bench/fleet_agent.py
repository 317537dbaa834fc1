"""The agent every instance of ``bench_fleet.py`` runs (``AGENT_APP=bench.fleet_agent:AGENTS``): a small task of
two steps, one of which appends a memory message, so each task writes what real tasks write (step events,
checkpoints, memory) without sleeping or calling out."""

from __future__ import annotations

from typing import Any

from agent_runtime.sdk import Agent, Context

tick = Agent("tick")


@tick.step
def note(ctx: Context) -> Any:
    ctx.memory.append("assistant", f"tick {ctx.params.get('n', 0)}", {"task": str(ctx.task.id)})
    return {"n": ctx.params.get("n", 0)}


@tick.step
def done(ctx: Context) -> Any:
    return True


AGENTS = {"tick": tick}
