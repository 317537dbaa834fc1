"""Where a task's agent configuration (``ctx.config``) comes from: the control plane, asked when a task starts.

``ControlPlaneConfigSource`` asks ``GET {url}/internal/v1/agent-config`` with the instance token (as credentials
are asked): the tenant's effective configuration, its release's defaults with the customer's overrides on top.
Asked per task, not per boot, so a change applies to the next task without a restart. The runner records what a
task got on its row before its first step (``agent_runtime.state.tasks.config_record``): a replay after a crash
keeps the values the task started with. Credential references come as names; their values are never here.

The instance's ``AGENT_CONFIG`` is the base under the source's answer (``Runtime.config_fetch``); with no control
plane there is no source and every task gets ``AGENT_CONFIG`` alone. ``StaticConfigSource``: a fixed answer,
for embedding the runtime (tests, a developer's own harness).
"""

from __future__ import annotations

from typing import Any, Protocol

from agent_runtime.errors import RuntimeStateError
from agent_runtime.internal_api import InternalApiUnavailable, internal_get_json

__all__ = ["ConfigSource", "ConfigUnavailable", "ControlPlaneConfigSource", "StaticConfigSource"]


class ConfigUnavailable(RuntimeStateError):
    """The configuration could not be fetched now: the task waits and tries again (it never runs on a guess)."""


class ConfigSource(Protocol):
    def fetch(self) -> dict[str, Any]:
        """The tenant's effective agent configuration now; ConfigUnavailable if it cannot be had."""
        ...


class StaticConfigSource:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._config = dict(config or {})

    def fetch(self) -> dict[str, Any]:
        return dict(self._config)


class ControlPlaneConfigSource:
    """`GET {url}/internal/v1/agent-config` with the instance token: ``{"config": {...}}``."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ControlPlaneConfigSource({self.base_url!r})"

    def fetch(self) -> dict[str, Any]:
        try:
            body = internal_get_json(self.base_url, self._token, "/internal/v1/agent-config", timeout_s=self.timeout_s)
        except InternalApiUnavailable as exc:
            raise ConfigUnavailable(f"agent configuration unavailable: {exc.why}") from None
        config = body.get("config") if isinstance(body, dict) else None
        if not isinstance(config, dict):
            raise ConfigUnavailable("agent configuration: malformed answer from control plane")
        return config
