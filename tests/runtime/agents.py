"""Agents that exist only for tests (loaded with AGENT_APP=tests.runtime.agents:AGENTS): switches such as
"hang in this step" must never be reachable by a task submitter on a real instance."""

from __future__ import annotations

import threading
from typing import Any

from agent_examples.demo import DemoAgent

from agent_runtime.sdk import Agent, Context, Step


class HangingDemo(DemoAgent):
    """The demo agent whose step named by the task parameter `hang_step` blocks forever."""

    def steps(self, params: dict[str, Any]) -> list[Step]:
        def hang_or(step: Step) -> Step:
            if params.get("hang_step") != step.name:
                return step

            def hang(ctx: Context) -> Any:
                threading.Event().wait()

            return Step(step.name, hang)

        return [hang_or(s) for s in super().steps(params)]


multi = Agent("multi")


@multi.step
def notify(ctx: Context) -> Any:
    """Sends `emails` emails (a task parameter) in one step; a replay may ask for more than a crash left."""
    return [ctx.effect("email", {"from": "a@t", "to": f"user{i}@t", "subject": f"n{i} {ctx.task_id}",
                                 "body": "hi"})["message_id"] for i in range(int(ctx.params.get("emails", 1)))]


AGENTS = {"demo": HangingDemo(), "multi": multi}
