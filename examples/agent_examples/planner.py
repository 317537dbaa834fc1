"""Reasoning for the demo agent: a deterministic planner for tests and one on an OpenAI-compatible chat
model (the SDK's `ChatModel`, whose API key is fetched from the credential source at each call)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from agent_runtime.sdk import ChatModel

__all__ = ["DeterministicPlanner", "OpenAIChatPlanner", "Planner"]


class Planner(Protocol):
    def plan_queries(self, topic: str) -> list[str]: ...

    def write_summary(self, topic: str, findings: list[str]) -> str: ...


class DeterministicPlanner:
    def plan_queries(self, topic: str) -> list[str]:
        return [f"{topic} overview", f"{topic} pricing"]

    def write_summary(self, topic: str, findings: list[str]) -> str:
        return f"Report on {topic}\n\n" + "\n".join(f"- {f}" for f in findings) + "\n"


class OpenAIChatPlanner:
    """Plans and writes with `ChatModel(base_url, model)`; the API key is the credential `credential`."""

    def __init__(self, base_url: str, model: str, credentials: Any, credential: str = "openai",
                 timeout_s: float = 30.0) -> None:
        self.model = ChatModel(base_url, model, credentials=credentials, credential=credential,
                               timeout_s=timeout_s)

    def _chat(self, system: str, user: str) -> str:
        return self.model.chat(system, user)
    def plan_queries(self, topic: str) -> list[str]:
        text = self._chat("Return a JSON list of 2 short web search queries, nothing else.", topic)
        try:
            queries = json.loads(text)
            if isinstance(queries, list) and all(isinstance(q, str) for q in queries) and queries:
                return queries[:5]
        except ValueError:
            pass
        return [line.strip("-* ").strip() for line in text.splitlines() if line.strip()][:5]

    def write_summary(self, topic: str, findings: list[str]) -> str:
        return self._chat("Write a short report from these findings.", json.dumps({"topic": topic,
                                                                                   "findings": findings}))
