"""A small client for OpenAI-compatible chat completions (`POST {base_url}/chat/completions`).

The API key is fetched from the credential source at every call, so a revoked key stops the next call and
the key never sits in a checkpoint. Wrap calls in `ctx.tool(...)` to pay for each distinct prompt once.

Each completion is a `chat <model>` span (OpenTelemetry GenAI conventions: request and response model, the
completion's id, input and output tokens; the messages as content, secret-named fields redacted).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agent_runtime.host.tracing import content, content_enabled

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
        host = urllib.parse.urlsplit(self.base_url)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                                      "gen_ai.request.model": self.model,
                                      "gen_ai.request.temperature": self.temperature,
                                      "server.address": host.hostname or ""}
        if host.port:
            attributes["server.port"] = host.port
        with trace.get_tracer(__name__).start_as_current_span(f"chat {self.model}", kind=SpanKind.CLIENT,
                                                             attributes=attributes) as span:
            if content_enabled(span):
                span.set_attribute("gen_ai.input.messages", content(list(messages)))
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                answer = json.loads(resp.read())
            counts = answer.get("usage")
            if answer.get("id"):
                span.set_attribute("gen_ai.response.id", str(answer["id"]))
            if answer.get("model"):
                span.set_attribute("gen_ai.response.model", str(answer["model"]))
            if isinstance(counts, dict):
                span.set_attribute("gen_ai.usage.input_tokens", int(counts.get("prompt_tokens") or 0))
                span.set_attribute("gen_ai.usage.output_tokens", int(counts.get("completion_tokens") or 0))
            choice = (answer.get("choices") or [{}])[0]
            if choice.get("finish_reason"):
                span.set_attribute("gen_ai.response.finish_reasons", [str(choice["finish_reason"])])
            if content_enabled(span):
                span.set_attribute("gen_ai.output.messages", content([choice.get("message")]))
            return self._report(answer, counts, usage)

    def _report(self, answer: dict[str, Any], counts: Any, usage: Callable[..., object] | None) -> dict[str, Any]:
        """Hand the answer's token counts to `usage` (inside the call's span); the first choice's message."""
        if usage is not None and isinstance(counts, dict):
            usage(model=str(answer.get("model") or self.model), input_tokens=int(counts.get("prompt_tokens") or 0),
                  output_tokens=int(counts.get("completion_tokens") or 0),
                  key=str(answer["id"]) if answer.get("id") else None)
        return dict(answer["choices"][0]["message"])

    def chat(self, system: str, user: str) -> str:
        return str(self.complete([{"role": "system", "content": system}, {"role": "user", "content": user}])
                   .get("content") or "")
