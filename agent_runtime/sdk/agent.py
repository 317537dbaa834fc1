"""How an agent is defined: a kind and its ordered steps. No I/O and no runtime state here.

Two shapes, both accepted by `agent-host`:
- the decorator registry (`Agent("kind")`, then `@agent.step` on plain functions, in the order they run),
  in the spirit of DBOS's `@DBOS.step()`: nothing to subclass to get started;
- any object with a `kind` and a `steps(params) -> list[Step]` method (`AgentDefinition`), for agents whose
  steps depend on the task's parameters.

Retry and timeout policies sit next to the step they govern (`@agent.step(max_attempts=5, timeout_s=120)`),
as Temporal declares them next to the call, not in the host's configuration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

from agent_runtime.mcp.config import McpServerSpec, servers_validate

if TYPE_CHECKING:
    from agent_runtime.sdk.context import Context

__all__ = ["VERSION_POLICIES", "Agent", "AgentDefinition", "EffectFactory", "Step", "StepFn", "check_config_schema",
           "check_connections", "check_egress", "check_kind"]

StepFn = Callable[["Context"], Any]
# An effect provider an agent package brings itself: an adapter, or a factory called once per instance with
# the instance's agent configuration (AGENT_CONFIG) and its credential source.
EffectFactory = Callable[[Mapping[str, Any], Any], Any]

# What happens to a task started on an earlier release when the instance moves to this one (`host.release_policy`):
# "pinned" (the default): it finishes on the release it started on; "compatible": the author declares these steps
# able to continue a case file an earlier release began, so it continues here (recorded as a crossing).
VERSION_POLICIES = ("pinned", "compatible")

_KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
_STEP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")
# A provider name as the control plane's OAuth clients spell it (a slug of at most 60 characters).
_PROVIDER = re.compile(r"^[-a-zA-Z0-9_]{1,60}$")
# A host an agent reaches on the internet, as the control plane's egress rules spell it (egress.rules.HOST_PATTERN,
# repeated: the runtime never imports the control plane; tests/provisioning/test_isolation_egress.py checks both
# agree): a DNS name or IPv4 literal, or "*." and at least two labels; no port (a release's hosts get the web ports,
# 443 and 80).
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
EGRESS_HOST_PATTERN = rf"^(?:\*\.{_HOST_LABEL}(?:\.{_HOST_LABEL})+|{_HOST_LABEL}(?:\.{_HOST_LABEL})*)$"
_EGRESS_HOST = re.compile(EGRESS_HOST_PATTERN)
MAX_EGRESS_HOSTS = 100


def check_kind(kind: str) -> str:
    """Kinds are stored on every task row and named in URLs: keep them short and plain."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise ValueError(f"agent kind {kind!r} must match {_KIND.pattern} (lower case, digits, '_', '.', '-')")
    return kind


def check_config_schema(schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An object schema or None. Only the shape is checked here (no I/O, no validator): the control plane checks
    the schema itself with `jsonschema` at upload, where a mistake is a 400 instead of an agent that won't boot."""
    if schema is None:
        return None
    if not isinstance(schema, Mapping):
        raise ValueError("config_schema must be a JSON Schema object (a dict), e.g. {'type': 'object', ...}")
    if schema.get("type", "object") != "object":
        raise ValueError("config_schema must describe an object (\"type\": \"object\"): ctx.config is a mapping")
    if not isinstance(schema.get("properties", {}), Mapping):
        raise ValueError("config_schema's 'properties' must be an object")
    return dict(schema)


def check_connections(providers: Iterable[str] | None) -> tuple[str, ...]:
    """The providers an agent declares it uses (``ctx.connections.get(provider)``), sorted and unique. The control
    plane hands a release's instance only the connections its agents declare."""
    if providers is None:
        return ()
    if isinstance(providers, str):
        raise ValueError("connections must be a list of provider names, e.g. ['google'], not a string")
    found = set()
    for provider in providers:
        if not isinstance(provider, str) or not _PROVIDER.match(provider):
            raise ValueError(f"connection provider {provider!r} must match {_PROVIDER.pattern}")
        found.add(provider)
    return tuple(sorted(found))


def check_egress(hosts: Iterable[str] | None) -> tuple[str, ...]:
    """The internet hosts an agent declares it calls (``Agent(egress=["api.openai.com"])``), lower case, sorted and
    unique. In an isolated instance the egress proxy lets the release's tenants reach these (on 443 and 80) besides
    what the operator allows; anything else is refused."""
    if hosts is None:
        return ()
    if isinstance(hosts, str):
        raise ValueError("egress must be a list of host names, e.g. ['api.openai.com'], not a string")
    found = set()
    for host in hosts:
        if not isinstance(host, str) or len(host) > 253 or not _EGRESS_HOST.match(host):
            raise ValueError(f"egress host {str(host)[:80]!r} must be a host name (api.openai.com) or *.suffix "
                             "(*.example.com), without a scheme, port or path")
        found.add(host.lower())
    if len(found) > MAX_EGRESS_HOSTS:
        raise ValueError(f"egress may name at most {MAX_EGRESS_HOSTS} hosts")
    return tuple(sorted(found))


@dataclass(frozen=True)
class Step:
    """One durable step: it runs until it returns, then its result is checkpointed and it never runs again.

    `max_attempts` counts attempts (errors, crashes, kills, hangs) before the task is blocked as a poison
    step (None: the host's AGENT_STEP_MAX_ATTEMPTS); waits on effects and planned stops do not count;
    `timeout_s` is how long the step may go without calling `ctx.progress()` before /healthz reports the
    instance stuck (None: the host's AGENT_STEP_TIMEOUT_S).
    """

    name: str
    fn: StepFn
    max_attempts: int | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not _STEP.match(self.name):
            raise ValueError(f"step name {self.name!r} must match {_STEP.pattern}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")


@runtime_checkable
class AgentDefinition(Protocol):
    """What `agent-host` runs: a kind and the steps of one task of that kind."""

    kind: str

    def steps(self, params: dict[str, Any]) -> list[Step]: ...


class Agent:
    """A decorator registry for an agent's steps.

    >>> hello = Agent("hello")
    >>> @hello.step
    ... def greet(ctx): return {"greeting": "hi"}
    >>> [s.name for s in hello.steps({})]
    ['greet']
    """

    def __init__(self, kind: str, *, description: str = "",
                 effects: Mapping[str, Any] | None = None,
                 summarize: Callable[[Any, list[Any]], str] | None = None, conversational: bool = False,
                 config_schema: Mapping[str, Any] | None = None, version_policy: str = "pinned",
                 connections: Iterable[str] | None = None,
                 mcp_servers: Mapping[str, Any] | None = None, egress: Iterable[str] | None = None) -> None:
        self.kind = check_kind(kind)
        # MCP servers this release brings (`ctx.mcp(name)`), e.g. stdio servers shipped inside it
        # ({"name": {"module": "pkg.server"}}); checked here, so a release that names one wrongly fails its probe.
        # The instance's AGENT_MCP_SERVERS and the customer's configuration replace one of the same name.
        self.mcp_servers: dict[str, McpServerSpec] = servers_validate(dict(mcp_servers or {}), stdio=True)
        if version_policy not in VERSION_POLICIES:
            raise ValueError(f"version_policy must be one of {', '.join(VERSION_POLICIES)}, not {version_policy!r}")
        # A task of this kind started on an earlier release: finish it there ("pinned") or continue it here
        # ("compatible": these steps read the case files an earlier release wrote). Read by the host per task.
        self.version_policy = version_policy
        self.description = description
        # The JSON Schema (an object schema) of what this agent reads from ctx.config. The release probe hands it
        # to the control plane at upload, which validates the release's defaults and every customer's overrides
        # against it; a property with "format": "credential" holds the NAME of a vault credential, never a value.
        self.config_schema: dict[str, Any] | None = check_config_schema(config_schema)
        # The providers whose connected accounts this agent's steps use (ctx.connections.get(provider)). The release
        # probe reports them at upload; the control plane refuses the instance any provider no agent declared.
        self.connections: tuple[str, ...] = check_connections(connections)
        # The internet hosts this agent's steps call (a model provider's API): the release probe reports them at
        # upload and, in an isolated instance, the egress proxy lets this release's tenants reach them (443, 80).
        self.egress: tuple[str, ...] = check_egress(egress)
        # Answers messages: a message posted to a thread of the instance becomes a task of this kind with params
        # {"thread", "question", "message_id"}; its steps answer with ctx.reply (docs/instance-api.md).
        self.conversational = conversational
        # How this agent's conversation threads are folded when they outgrow the window (fn(previous summary,
        # messages) -> text); None: the host's extractive default. The host calls it, not the agent.
        self.summarize = summarize
        # Effect providers this agent brings (adapter or EffectFactory), by effect name; they take precedence
        # over the instance's configured providers of the same name for this agent's tasks.
        self.effects: dict[str, Any] = dict(effects or {})
        self._steps: list[Step] = []

    def __repr__(self) -> str:
        return f"Agent({self.kind!r}, steps={[s.name for s in self._steps]})"

    @overload
    def step(self, fn: StepFn, /) -> StepFn: ...

    @overload
    def step(self, fn: None = None, /, *, name: str | None = None, max_attempts: int | None = None,
             timeout_s: float | None = None) -> Callable[[StepFn], StepFn]: ...

    def step(self, fn: StepFn | None = None, /, *, name: str | None = None, max_attempts: int | None = None,
             timeout_s: float | None = None) -> StepFn | Callable[[StepFn], StepFn]:
        """Register `fn` as the next step (usable bare, `@agent.step`, or with options)."""

        def register(f: StepFn) -> StepFn:
            step = Step(name or f.__name__, f, max_attempts=max_attempts, timeout_s=timeout_s)
            if any(s.name == step.name for s in self._steps):
                raise ValueError(f"agent {self.kind!r} already has a step named {step.name!r}")
            self._steps.append(step)
            return f

        return register(fn) if fn is not None else register

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return list(self._steps)
