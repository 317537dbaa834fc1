"""Pluggable reasoning for the demo agent: a deterministic planner for tests and an OpenAI-compatible
chat client whose API key is fetched from the credential source at each call (never stored)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Protocol

from agent_runtime.credentials import CredentialSource

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
    """POST {base_url}/chat/completions (OpenAI wire format), Authorization from credential `credential`."""

    def __init__(self, base_url: str, model: str, credentials: CredentialSource, credential: str = "openai",
                 timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.credentials = credentials
        self.credential = credential
        self.timeout_s = timeout_s

    def _chat(self, system: str, user: str) -> str:
        key = self.credentials.get(self.credential).value
        body: dict[str, Any] = {"model": self.model, "temperature": 0,
                                "messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": user}]}
        req = urllib.request.Request(  # noqa: S310 - configured endpoint
            f"{self.base_url}/chat/completions", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
            answer = json.loads(resp.read())
        return str(answer["choices"][0]["message"]["content"])

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
