"""``python -m agent_runtime.host.pinned_child TASK``: one task on the earlier release it started on.

Started by the host (``host.pinned``), never by hand: it loads only the release named by its environment, runs
the task's remaining steps exactly as the host's worker would (``runner.run_task``: checkpoints, ledger, journal,
effects built from the task's recorded configuration) and exits with the outcome's code. It takes no lease and
serves nothing: it writes as the host (its lease holder) and dies with it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from uuid import UUID

from agent_runtime.db import connect
from agent_runtime.errors import AgentLoadError, ConfigError
from agent_runtime.host.config import HostConfig
from agent_runtime.host.loader import load_agents
from agent_runtime.host.logs import setup_json_logging
from agent_runtime.host.pinned import HOLDER_VARIABLE, OUTCOME_CODES
from agent_runtime.host.process import Host
from agent_runtime.host.runner import run_task
from agent_runtime.host.tracing import setup_tracing
from agent_runtime.state import tasks as task_store

log = logging.getLogger("agent_runtime.host.pinned")

EXIT_USAGE = 20
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when the host dies: a host killed mid-task must not leave its child stepping on."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the fence still refuses its writes after a takeover
        pass
    if os.getppid() == 1:  # the host died before the line above ran
        sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    setup_json_logging()
    try:
        task_id = UUID(argv[0])
        holder = os.environ[HOLDER_VARIABLE]
        cfg = HostConfig.from_env()
    except (IndexError, ValueError, KeyError, ConfigError) as exc:
        print(f"agent_runtime.host.pinned_child: {exc!r} (started by agent-host only)", file=sys.stderr)
        return EXIT_USAGE
    setup_tracing(os.environ, tenant_id=cfg.tenant_id, release=cfg.release_version)
    host = Host(cfg)
    signal.signal(signal.SIGTERM, lambda *_: host.stop_event.set())
    label = f"release {cfg.release_version} ({cfg.release_digest})" if cfg.release else "the runtime's agents"
    with connect(cfg.database_url, cfg.schema, autocommit=True, application_name=f"agent-host:{holder}",
                 pooled=cfg.database_pooled) as conn:
        rt = host.build_runtime(conn)
        task = task_store.get(conn, task_id)
        if task is None:
            return EXIT_USAGE
        try:
            agents = load_agents(None, cfg.agent_kinds, release_path=cfg.release_path, release=label)
        except AgentLoadError as exc:
            task_store.set_status(conn, task_id, "blocked", "release_unavailable",
                                  f"the release this task started on no longer loads: {exc}")
            return OUTCOME_CODES["blocked"]
        agent = agents.agents.get(task.kind)
        if agent is None:
            task_store.set_status(conn, task_id, "blocked", "unknown_kind",
                                  f"{label} runs {sorted(agents.agents)}, not {task.kind!r}")
            return OUTCOME_CODES["blocked"]
        log.info("task runs on the release it started on", extra={
            "event": "task_pinned", "task_id": str(task_id), "release": cfg.release})
        outcome = run_task(rt, agent, task_id)
    return OUTCOME_CODES.get(outcome, OUTCOME_CODES["retry"])


if __name__ == "__main__":
    sys.exit(main())
