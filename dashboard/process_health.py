"""The control plane's own processes as the staff dashboard shows them: the overview's "Processes" card and the
incident banner on every staff page.

One read, ``process_health``: web (the process answering: up by construction), the database, broker and cache as
``/readyz`` probes them, the worker per queue it should consume and beat as their heartbeats say
(``controlplane.health``, which reads ``controlplane.liveness``). Nothing is probed here that ``/readyz`` does not
probe; this module only turns its checks into rows with a state (up, stale, down) and a "since".

The banner is on every page, so ``process_health_cached`` keeps the rows for ``CACHE_S``: a page render does not
open a broker connection (each probe is bounded by ``health.TIMEOUT_S``, but a dead broker would otherwise cost
every page up to that). The overview reads fresh and refreshes the cached copy, so the page staff look at when
the banner sends them there is never older than its own render. No writes but the cache; no views.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.core.cache import cache

from controlplane.health import Check, readiness_checks, service_check

__all__ = ["CACHE_S", "ProcessRow", "process_health", "process_health_cached", "worker_queues"]

CACHE_S = 5.0  # well under one heartbeat timeout (10 s by default): the banner lags the overview by at most this
_CACHE_KEY = "dashboard:process-health:v1"
_DOWN_SINCE_KEY = "dashboard:process-down-since:"  # + name: when a probed dependency was first seen failing
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessRow:
    name: str  # "web", "database", "broker", "cache", "worker", "beat"
    label: str  # what the card and the banner call it: "worker (queue controlplane)"
    state: str  # "up", "stale", "down" or "untracked"
    detail: str  # the check's own words (no address: the same text /readyz gives)
    since: datetime | None = None  # up since (a process's start), stale since (its last heartbeat), down since
    heartbeat_age_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.state in ("up", "untracked")

    @property
    def sentence(self) -> str:
        """What is wrong, with since when, for the banner: "the worker (queue q) has sent no heartbeat since ..."."""
        at = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""
        if self.state == "stale":
            return f"the {self.label} has sent no heartbeat{at} ({self.detail})"
        if self.name in ("worker", "beat"):
            return f"the {self.label} is down{at} ({self.detail})"
        return f"the {self.label} does not answer{at} ({self.detail})"


def worker_queues() -> tuple[str, ...]:
    """The queues a worker must consume: the default one and every queue a task is routed to."""
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    routed = {str(r["queue"]) for r in routes.values() if isinstance(r, dict) and r.get("queue")} \
        if isinstance(routes, dict) else set()
    return tuple(sorted({settings.CELERY_TASK_DEFAULT_QUEUE, *routed}))


def _epoch(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts is not None else None


def _down_since(name: str, failing: bool, now: float) -> datetime | None:
    """A probed dependency has no heartbeat to say since when it fails: the first render that saw it failing
    does (kept in the cache; without a working cache, "since" is left out rather than made up)."""
    key = _DOWN_SINCE_KEY + name
    try:
        if not failing:
            cache.delete(key)
            return None
        cache.add(key, now, timeout=86400)
        first = cache.get(key)
    except Exception as exc:  # the cache is what is down: the row says so already
        log.info("process health: the cache does not answer: %s", type(exc).__name__)
        return None
    return _epoch(float(first)) if first is not None else None


def _row(check: Check, label: str, now: float) -> ProcessRow:
    state = check.state
    if state is not None:
        return ProcessRow(check.name, label, state.state, check.detail, _epoch(state.since), state.heartbeat_age_s)
    if check.name in ("worker", "beat"):  # Redis for heartbeats did not answer: the service cannot be judged
        return ProcessRow(check.name, label, "down", check.detail, _down_since(check.name, True, now))
    return ProcessRow(check.name, label, "up" if check.ok else "down", check.detail,
                      _down_since(check.name, not check.ok, now))


def process_health() -> list[ProcessRow]:
    """Every process and dependency of the control plane, probed now (the overview's "Processes" card)."""
    now = time.time()
    rows = [ProcessRow("web", "web", "up", f"pid {os.getpid()} on {socket.gethostname()}, answering this page",
                       heartbeat_age_s=0.0)]
    for check in readiness_checks():
        if check.name == "worker":
            # One row per queue: a worker consuming only another queue leaves this one without a worker.
            rows += [_row(service_check("worker", queue=q), f"worker (queue {q})", now) for q in worker_queues()]
        else:
            rows.append(_row(check, check.name, now))
    try:
        cache.set(_CACHE_KEY, rows, timeout=CACHE_S)
    except Exception as exc:
        log.info("process health: not cached: %s", type(exc).__name__)
    return rows


def process_health_cached() -> list[ProcessRow]:
    """``process_health`` as of at most ``CACHE_S`` ago: what the banner on every staff page reads."""
    try:
        rows = cache.get(_CACHE_KEY)
    except Exception:
        rows = None
    return rows if rows is not None else process_health()
