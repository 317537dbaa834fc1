"""A small client for OpenAI-compatible chat completions (`POST {base_url}/chat/completions`).

The API key is fetched from the credential source at every call, so a revoked key stops the next call and
the key never sits in a checkpoint. Wrap calls in `ctx.tool(...)` to pay for each distinct prompt once.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ChatModel"]


class ChatModel:
    def __init__(self, base_url: str, model: str, *, credentials: Any = None, credential: str | None = "openai",
                 temperature: float = 0.0, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.credentials = credentials
        self.credential = credential
        self.temperature = temperature
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ChatModel({self.base_url!r}, {self.model!r})"

    def complete(self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None,
                 usage: Callable[..., object] | None = None) -> dict[str, Any]:
        """The assistant message of the first choice: {'role', 'content', ['tool_calls']}.

        ``usage``: called with the answer's token counts (``usage=ctx.usage`` records them for billing, keyed by
        the completion's id); not called when the provider reports none."""
        body: dict[str, Any] = {"model": self.model, "temperature": self.temperature, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        headers = {"Content-Type": "application/json"}
        if self.credentials is not None and self.credential:
            headers["Authorization"] = f"Bearer {self.credentials.get(self.credential).value}"
        req = urllib.request.Request(  # noqa: S310 - configured endpoint
            f"{self.base_url}/chat/completions", data=json.dumps(body).encode(), method="POST", headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
            answer = json.loads(resp.read())
        counts = answer.get("usage")
        if usage is not None and isinstance(counts, dict):
            usage(model=str(answer.get("model") or self.model), input_tokens=int(counts.get("prompt_tokens") or 0),
                  output_tokens=int(counts.get("completion_tokens") or 0),
                  key=str(answer["id"]) if answer.get("id") else None)
        return dict(answer["choices"][0]["message"])

    def chat(self, system: str, user: str) -> str:
        return str(self.complete([{"role": "system", "content": system}, {"role": "user", "content": user}])
                   .get("content") or "")
