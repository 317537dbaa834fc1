"""The dev loop's host: `agent-host` running an agent package from its source directory, reloading it on change.

`agent-host dev PATH` (agent_runtime.host.dev) starts this module as the instance process. It is the ordinary
`Host` (same read-back, checkpoints, effect ledger, single-writer lease), with one difference: its agents are
proxies over the package's source. Before every step and every new task the proxy compares the modification
times of the package's `.py` files with the last import; when one changed, the package's modules are dropped
from `sys.modules` and imported again, so a running task's next step runs the new code (a step is the unit of
replay: one that already started finishes on the code it started with). A source that fails to import is
logged (`agent_reload_failed`, with file and line) and the previous code keeps running until the next save.

An mtime poll rather than a file watcher: `watchfiles` is no dependency of the runtime, and the poll costs one
`stat` per source file at a step boundary, where the answer is needed. Steps added or reordered apply to tasks
that start after the save (a running task keeps the step list it started with; a step it still needs that the
new source removed runs its previous code). Effect adapters an agent brings are built once per host.

Nothing here is used by production instances; no wheel is built or installed.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_runtime.errors import AgentLoadError, ConfigError
from agent_runtime.host.config import HostConfig
from agent_runtime.host.loader import LoadedAgents, load_agents
from agent_runtime.host.logs import setup_json_logging
from agent_runtime.host.process import EXIT_CONFIG, Host
from agent_runtime.sdk.agent import AgentDefinition, Step

__all__ = ["DevHost", "ReloadingAgent", "SourceReloader", "main"]

log = logging.getLogger("agent_runtime.host.dev")


class SourceReloader:
    """The agents of the package under ``source``, imported again whenever one of its files changes."""

    def __init__(self, source: Path, apps: list[str]) -> None:
        self.source = source.resolve()
        self.apps = apps
        self._lock = threading.Lock()
        if str(self.source) not in sys.path:
            sys.path.insert(0, str(self.source))
        self._stamp = self._scan()
        self.loaded = self._import()
        self.generation = 1

    def _scan(self) -> dict[str, tuple[int, int]]:
        """(mtime, size) of every Python file of the package: a save changes one of them. Hidden directories (the
        state directory `.agent-dev/` with its database among them), caches and build output are not walked."""
        stamp = {}
        for root, dirs, files in os.walk(self.source):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build", "dist")]
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:  # removed between listing and stat: the next scan sees it gone
                    continue
                stamp[path] = (st.st_mtime_ns, st.st_size)
        return stamp

    def _purge(self) -> None:
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            if origin and Path(origin).resolve().is_relative_to(self.source):
                del sys.modules[name]
        importlib.invalidate_caches()

    def _import(self) -> LoadedAgents:
        agents: dict[str, AgentDefinition] = {}
        sources: dict[str, str] = {}
        for app in self.apps:
            found = load_agents(app)
            for kind, agent in found.agents.items():
                if kind in agents:
                    raise AgentLoadError(f"two entry points declare the agent kind {kind!r}: {sources[kind]} and "
                                         f"{found.sources[kind]}")
                agents[kind], sources[kind] = agent, found.sources[kind]
        return LoadedAgents(agents, sources)

    def refresh(self) -> bool:
        """Import the package again if a file changed since the last import; True when new code is loaded."""
        with self._lock:
            stamp = self._scan()
            if stamp == self._stamp:
                return False
            changed = sorted(Path(p).name for p in set(stamp) ^ set(self._stamp) |
                             {p for p in stamp if self._stamp.get(p) != stamp[p]})
            self._stamp = stamp
            previous = dict(sys.modules)
            self._purge()
            try:
                loaded = self._import()
            except AgentLoadError as exc:
                # The previous modules come back, so its steps keep running until the next save fixes the source.
                sys.modules.update({k: v for k, v in previous.items() if k not in sys.modules})
                log.error("agent source failed to import; still running the previous code",
                          extra={"event": "agent_reload_failed", "error": str(exc), "files": changed})
                return False
            self.loaded = loaded
            self.generation += 1
            log.info("agent source reloaded", extra={"event": "agent_reloaded", "generation": self.generation,
                                                      "files": changed, "agents": sorted(loaded.agents)})
            return True

    def agent(self, kind: str) -> AgentDefinition | None:
        return self.loaded.agents.get(kind)


class ReloadingAgent:
    """An `AgentDefinition` whose steps run the package's current code, looked up by name at each step."""

    def __init__(self, reloader: SourceReloader, kind: str) -> None:
        self.kind = kind
        self._reloader = reloader

    def _current(self) -> Any:
        return self._reloader.agent(self.kind)

    @property
    def conversational(self) -> bool:
        return bool(getattr(self._current(), "conversational", False))

    @property
    def summarize(self) -> Any:
        return getattr(self._current(), "summarize", None)

    @property
    def effects(self) -> Mapping[str, Any]:
        return dict(getattr(self._current(), "effects", None) or {})

    def steps(self, params: dict[str, Any]) -> list[Step]:
        self._reloader.refresh()
        current = self._current()
        if current is None:
            raise AgentLoadError(f"the package no longer declares the agent kind {self.kind!r}")
        return [Step(s.name, self._proxy(s, params), max_attempts=s.max_attempts, timeout_s=s.timeout_s)
                for s in current.steps(params)]

    def _proxy(self, started_with: Step, params: dict[str, Any]) -> Any:
        def run(ctx: Any) -> Any:
            self._reloader.refresh()  # the step boundary: a save since the task started applies here
            current = self._current()
            for step in current.steps(params) if current is not None else []:
                if step.name == started_with.name:
                    return step.fn(ctx)
            return started_with.fn(ctx)

        run.__name__ = started_with.name
        return run


class DevHost(Host):
    """The ordinary host, with agents from a source directory that reload at step boundaries."""

    def __init__(self, cfg: HostConfig, source: Path, apps: list[str]) -> None:
        super().__init__(cfg)
        self.source, self.apps = source, apps
        self.reloader: SourceReloader | None = None

    def load_agents(self) -> bool:
        try:
            self.reloader = SourceReloader(self.source, self.apps)
        except AgentLoadError as exc:
            self.load_error = str(exc)
            self.progress.set_status("agent_load_failed")
            log.error("agent package could not be loaded; staying up, not ready",
                      extra={"event": "agent_load_failed", "error": self.load_error})
            return False
        loaded = self.reloader.loaded
        self.agents = LoadedAgents({k: ReloadingAgent(self.reloader, k) for k in loaded.agents},
                                   {k: f"{s} (from source {self.source})" for k, s in loaded.sources.items()})
        log.info("agents loaded", extra={"event": "agents_loaded", "agents": self.agents.describe()})
        return True


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_runtime.host.devreload SOURCE APP [APP...]`, configured by the same environment as
    `agent-host`; started by `agent-host dev`, not by hand."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m agent_runtime.host.devreload SOURCE_DIR MODULE:ATTR [MODULE:ATTR ...]",
              file=sys.stderr)
        return EXIT_CONFIG
    setup_json_logging()
    try:
        cfg = HostConfig.from_env()
    except ConfigError as exc:
        print(f"agent-host dev: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # Compiled files of the agent's source are neither written nor read: a save within the same second that
    # keeps the file's size would otherwise import the stale .pyc. Set only now, so the runtime's own imports
    # above used their caches.
    sys.dont_write_bytecode = True
    sys.pycache_prefix = str(cfg.host_dir / "no-pycache")
    # The author's local instance keeps traces like a customer's (docs/observability.md); a collector is optional.
    from agent_runtime.host.tracing import setup_tracing

    setup_tracing(os.environ, tenant_id=cfg.tenant_id, release=cfg.release_version)
    return DevHost(cfg, Path(argv[0]), argv[1:]).run()


if __name__ == "__main__":
    sys.exit(main())
