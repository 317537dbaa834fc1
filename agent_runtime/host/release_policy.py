"""The version policy per task: where a task runs when the instance's release is not the one it started on.

A task interrupted by a rollout (steps 1-4 on v1, the instance restarted on v2) would otherwise run its last step
on code that never saw its case file. So a task records the release it started on (``tasks.release``, before its
first step) and, by default, finishes there: the control plane keeps the instance's earlier releases loadable
(``AGENT_RELEASES_RETAINED``) and the host runs such a task in a child process on that release
(``host.pinned``). An agent whose author declares its steps compatible (``Agent(version_policy="compatible")``)
continues the task on the release the instance runs instead, and the crossing is recorded ('release_crossed',
counted by the rollout's health gate). Where the earlier release cannot be loaded (an image release, or one no
longer kept), the task is blocked ``release_unavailable`` with its lever: Retry continues it here, and it runs
again by itself once the instance boots on its release (a rollback).

Not here: how the child runs (``host.pinned``), which releases are kept (the control plane's release history).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from agent_runtime.host.config import HostConfig, RetainedRelease
from agent_runtime.state import tasks as task_store

__all__ = ["HERE", "Here", "Pinned", "Placement", "Unavailable", "current_release", "loadable_digests", "place"]


@dataclass(frozen=True)
class Here:
    """Run in this host, on the release it loaded."""


@dataclass(frozen=True)
class Pinned:
    """Run in a child process on the earlier release the task started on."""

    release: RetainedRelease


@dataclass(frozen=True)
class Unavailable:
    """The task's release cannot be loaded here: block it, saying so and what clears it."""

    detail: str


Placement = Here | Pinned | Unavailable
HERE = Here()


def current_release(cfg: HostConfig) -> dict[str, str]:
    """The release this host runs as a task records it; empty strings: the runtime environment's agents."""
    release = cfg.release or {"version": "", "digest": ""}
    return {"version": release["version"], "digest": release["digest"]}


def loadable_digests(cfg: HostConfig) -> list[str]:
    """Digests of every release a task may run on in this instance: its own and the ones it keeps."""
    return [current_release(cfg)["digest"], *(r.digest for r in cfg.retained_releases)]


def _label(release: dict[str, str]) -> str:
    if not release.get("digest"):
        return "the runtime's agents"
    return f"release {release.get('version') or '(no version)'} ({release['digest'][:19]}…)"


def place(conn: psycopg.Connection, task_id: UUID, agent: Any | None, cfg: HostConfig) -> Placement:
    """Where `task_id` runs. Records the release it starts on the first time it is placed where its kind runs; a
    compatible agent moves it to this host's release (recorded as a crossing). ``agent``: this host's agent of
    the task's kind (None: this release has none, which only an earlier release may still run)."""
    current = current_release(cfg)
    started = task_store.release_recorded(conn, task_id)
    if started is None:
        # Never placed: it has no history on any release. It starts here if this release can run it; if not, the
        # caller blocks it (unknown kind) and nothing is recorded, so whichever release can run it later takes it.
        if agent is not None:
            task_store.release_record(conn, task_id, current)
        return HERE
    if started.get("digest", "") == current["digest"]:
        return HERE
    if agent is not None and getattr(agent, "version_policy", "pinned") == "compatible":
        task_store.release_cross(conn, task_id, current,
                                 "its agent declares its steps compatible (version_policy='compatible')")
        return HERE
    for release in cfg.retained_releases:
        if release.digest == started.get("digest"):
            return Pinned(release)
    return Unavailable(
        f"this task started on {_label(started)}, which this instance cannot load (it runs {_label(current)}); "
        f"it finishes on the release it started on unless its agent declares version_policy='compatible'. "
        f"Retry continues it on {_label(current)} from its last checkpoint; it also runs again by itself once "
        f"the instance runs {_label(started)} again")
