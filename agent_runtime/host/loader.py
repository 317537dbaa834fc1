"""Which agents this instance runs: discovered from installed packages, never built into the runtime.

Sources, in order: `AGENT_APP=module:attr` (one module, for development and tests), else, when the instance runs
an operator's release (`AGENT_RELEASE_PATH`, its install directory), the entry points of the distributions in
that directory only, else every entry point of the group `agent_runtime.agents` in the installed distributions.
A release never mixes with the runtime environment's agents (the built-in examples, say): what the operator
uploaded is exactly what runs. An entry point (or AGENT_APP) names an agent object, a list of them, or a dict of
kind -> agent; a class is instantiated without arguments. `AGENT_KINDS` (comma-separated) restricts the
instance to those kinds and requires each of them; the control plane sets it to the kinds its release declared at
upload (issue 39). It is lazy: only the entry points named after a wanted kind are imported (the convention, and
the examples' habit: `demo = agent_examples.demo:demo`), so an undeclared agent's module, and what it imports
(LangGraph, a vendor SDK), never costs the instance memory. Only when a wanted kind is provided by no entry point
of its name are the others imported, one at a time, until every wanted kind is found.

Every failure is an `AgentLoadError` whose message names the package and the cause, so the host can stay
up, not ready, and say why on /readyz, in its log and in its heartbeat (never a crash loop).
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from agent_runtime.errors import AgentLoadError
from agent_runtime.sdk.agent import AgentDefinition, check_kind

__all__ = ["ENTRY_POINT_GROUP", "LoadedAgents", "load_agents"]

ENTRY_POINT_GROUP = "agent_runtime.agents"


@dataclass(frozen=True)
class LoadedAgents:
    agents: dict[str, AgentDefinition]
    # kind -> where it came from ("distribution-name (entry point 'x = mod:attr')" or "AGENT_APP=mod:attr")
    sources: dict[str, str] = field(default_factory=dict)

    def describe(self) -> list[dict[str, str]]:
        return [{"kind": k, "source": self.sources.get(k, "")} for k in sorted(self.agents)]


def _short_error(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _agents_in(obj: Any, source: str) -> list[AgentDefinition]:
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise AgentLoadError(f"{source}: could not instantiate {obj.__name__}: {_short_error(exc)}") from exc
    if isinstance(obj, dict):
        items: Iterable[Any] = obj.values()
    elif isinstance(obj, list | tuple):
        items = obj
    else:
        items = [obj]
    found = []
    for item in items:
        if isinstance(item, type):
            item = _agents_in(item, source)[0]
        if not isinstance(item, AgentDefinition) or not isinstance(getattr(item, "kind", None), str):
            raise AgentLoadError(f"{source}: {item!r} is not an agent (it needs a 'kind' and a 'steps(params)' "
                                 "method; see docs/sdk.md)")
        try:
            check_kind(item.kind)
        except ValueError as exc:
            raise AgentLoadError(f"{source}: {exc}") from exc
        found.append(item)
    if not found:
        raise AgentLoadError(f"{source}: declares no agent")
    return found


def _load_app(app: str) -> tuple[Any, str]:
    source = f"AGENT_APP={app}"
    module_name, sep, attr = app.partition(":")
    if not sep or not module_name or not attr:
        raise AgentLoadError(f"{source}: must be 'module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AgentLoadError(f"{source}: module failed to import: {_short_error(exc)}") from exc
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise AgentLoadError(f"{source}: module {module_name} has no attribute {attr!r}") from None
    return obj, source


def _release_entry_points(path: Path) -> list[metadata.EntryPoint]:
    """The agent entry points of the distributions installed in ``path`` (a release's install directory)."""
    if not path.is_dir():
        raise AgentLoadError(f"its install directory {path} does not exist (not installed here, or not visible to "
                             "this instance)")
    dists = list(metadata.distributions(path=[str(path)]))
    if not dists:
        raise AgentLoadError(f"no distribution is installed in {path}")
    points = [ep for dist in dists for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    if not points:
        names = ", ".join(sorted(d.metadata["Name"] or "?" for d in dists))
        raise AgentLoadError(f"{names} declares no entry point in the group {ENTRY_POINT_GROUP!r} (see docs/sdk.md)")
    # Its modules import from there, ahead of the runtime's environment, as the release probe imported them (the
    # control plane's driver puts it on PYTHONPATH already; a host started by hand may not have).
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    return points


def _sorted_points(points: Iterable[metadata.EntryPoint] | None = None) -> list[metadata.EntryPoint]:
    """The group's entry points (reading their metadata imports nothing), in a stable order."""
    found = metadata.entry_points(group=ENTRY_POINT_GROUP) if points is None else points
    return sorted(found, key=lambda e: (e.dist.name if e.dist else "", e.name))


def _load_point(ep: metadata.EntryPoint) -> tuple[Any, str]:
    """Import one entry point's module: the only place agent code is imported from installed packages."""
    dist = ep.dist.name if ep.dist else "unknown distribution"
    source = f"{dist} (entry point '{ep.name} = {ep.value}')"
    try:
        obj = ep.load()
    except (ModuleNotFoundError, AttributeError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name and not ep.module.startswith(exc.name):
            raise AgentLoadError(f"{source}: failed to import: {_short_error(exc)}") from exc
        raise AgentLoadError(f"{source}: names nothing ({_short_error(exc)})") from exc
    except Exception as exc:
        raise AgentLoadError(f"{source}: failed to import: {_short_error(exc)}") from exc
    return obj, source


def load_agents(app: str | None = None, kinds: Iterable[str] | None = None, *, release_path: Path | None = None,
                release: str = "") -> LoadedAgents:
    """The instance's agents; ``release_path`` loads an operator's release, and every error then starts with
    ``release`` (its version and digest), so the operator reads which upload failed, not only which module."""
    if release_path is None:
        return _load(app, kinds, None)
    if app:
        # Either would leave the instance running other code than the release the control plane asked for.
        raise AgentLoadError(f"AGENT_APP={app} and AGENT_RELEASE_PATH={release_path} are both set: the instance runs "
                             "one source of agents; unset AGENT_APP to run the release")
    try:
        return _load(None, kinds, release_path)
    except AgentLoadError as exc:
        raise AgentLoadError(f"{release or f'the release in {release_path}'}: {exc}") from exc


def _wanted_points(points: list[metadata.EntryPoint], wanted: list[str],
                   found: Container[str]) -> Iterator[tuple[Any, str]]:
    """The entry points named after a wanted kind, imported (all of them: two packages claiming a kind are still
    refused); then the others one by one, only while a wanted kind is missing from ``found`` (the caller's agents
    so far), for an entry point named otherwise than its kind. With the convention kept, an undeclared agent's
    module is never imported."""
    named = [ep for ep in points if ep.name in wanted]
    for ep in named:
        yield _load_point(ep)
    for ep in points:
        if all(k in found for k in wanted):
            return
        if ep not in named:
            yield _load_point(ep)


def _load(app: str | None, kinds: Iterable[str] | None, release_path: Path | None) -> LoadedAgents:
    wanted = [k.strip() for k in (kinds or []) if k.strip()]
    agents: dict[str, AgentDefinition] = {}
    sources: dict[str, str] = {}
    candidates: Iterable[tuple[Any, str]]
    if app:
        candidates = [_load_app(app)]
    else:
        points = _sorted_points(_release_entry_points(release_path) if release_path is not None else None)
        if not points:
            raise AgentLoadError(f"no agent package is installed: no distribution declares an entry point in the "
                                 f"group {ENTRY_POINT_GROUP!r} and AGENT_APP is unset (see docs/sdk.md)")
        # Lazy: ``agents`` fills as the generator is pulled, and it stops importing once every wanted kind is in.
        candidates = _wanted_points(points, wanted, agents) if wanted else [_load_point(ep) for ep in points]
    for obj, source in candidates:
        for agent in _agents_in(obj, source):
            if agent.kind in agents and agents[agent.kind] is not agent:
                raise AgentLoadError(f"two packages claim the agent kind {agent.kind!r}: {sources[agent.kind]} and "
                                     f"{source}; uninstall one or set AGENT_KINDS / AGENT_APP")
            agents[agent.kind] = agent
            sources[agent.kind] = source
    if wanted:
        missing = [k for k in wanted if k not in agents]
        if missing:
            raise AgentLoadError(f"AGENT_KINDS names {missing}, which no installed package provides "
                                 f"(installed: {sorted(agents)})")
        agents = {k: agents[k] for k in wanted}
        sources = {k: sources[k] for k in wanted}
    return LoadedAgents(agents, sources)
