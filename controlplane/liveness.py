"""Liveness of the control plane's own services, the Celery worker and beat: a heartbeat each, not a guess.

A thread started from Celery's ``worker_ready`` / ``beat_init`` signals (``controlplane/celery.py``) writes its
process's record (pid, host, started, last seen) into one Redis hash per service every
``SERVICE_HEARTBEAT_INTERVAL_S``. A clean shutdown removes the record; the local supervisor's event listener
(``manage.py supervisor_events``) removes it the moment it sees the process exit and keeps the exit's reason,
so a killed worker is down at once rather than after the timeout. ``service_state`` reads it all back for
``/readyz`` and the staff dashboard: a service is up while one of its processes has a heartbeat fresher than
``SERVICE_HEARTBEAT_TIMEOUT_S``.

The hash lives in the heartbeats' Redis (``HEARTBEAT_REDIS_URL``, the broker's by default, the embedded one on
the embedded default). Without one (a broker that is no Redis and no ``HEARTBEAT_REDIS_URL``) liveness is not
tracked, and ``service_state`` says exactly that. No models and no views here.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

__all__ = ["SERVICES", "ServiceState", "service_beat", "service_exited", "service_forget", "service_started_at",
           "service_state",
           "heartbeat_start", "heartbeat_stop"]

SERVICES = ("worker", "beat")
_KEEP_EXIT_S = 86400
_PRUNE_AFTER_S = 3600  # records this old belong to processes long gone; whoever writes drops them
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceState:
    service: str
    ok: bool
    detail: str  # which process and how fresh, or why it is down; never an address (/readyz is public)
    tracked: bool = True
    pid: int | None = None
    host: str = ""
    heartbeat_age_s: float | None = None
    # "up", "stale" (records, none fresh: hung or killed without a supervisor to say so), "down" (its exit was
    # seen, or it never beat) or "untracked"; ``since`` (epoch seconds) is when that began: the newest process's
    # start when up, its last heartbeat when stale, its exit when down. The dashboard's banner says "since".
    state: str = "up"
    since: float | None = None
    queues: tuple[str, ...] = ()  # the queues the fresh processes consume (workers that say so)


@functools.cache
def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


def _redis() -> Any | None:
    url = str(settings.HEARTBEAT_REDIS_URL or "")
    return _client(url) if url else None


def _key(service: str) -> str:
    return f"{settings.HEARTBEAT_KEY_PREFIX}:svc:{service}"


def _field(host: str, pid: int) -> str:
    return f"{host}:{pid}"


def service_beat(service: str, *, pid: int, host: str, started_at: float, now: float | None = None,
                 queues: tuple[str, ...] = ()) -> None:
    client = _redis()
    if client is None:
        return
    now = time.time() if now is None else now
    record: dict[str, Any] = {"pid": pid, "host": host, "started_at": started_at, "seen_at": now}
    if queues:
        record["queues"] = list(queues)
    client.hset(_key(service), _field(host, pid), json.dumps(record))
    for field, raw in client.hgetall(_key(service)).items():
        if now - float(json.loads(raw).get("seen_at") or 0) > _PRUNE_AFTER_S:
            client.hdel(_key(service), field)


def service_started_at(service: str, *, pid: int, host: str) -> float | None:
    """When the process's heartbeat began (the worker was ready, beat initialised); None without one."""
    client = _redis()
    raw = client.hget(_key(service), _field(host, pid)) if client is not None else None
    return float(json.loads(raw)["started_at"]) if raw else None


def service_forget(service: str, *, pid: int, host: str) -> None:
    client = _redis()
    if client is not None:
        client.hdel(_key(service), _field(host, pid))


def service_exited(service: str, *, pid: int, host: str, detail: str, now: float | None = None) -> None:
    """The process is gone (its supervisor saw it exit): no longer alive, and why, for whoever looks."""
    client = _redis()
    if client is None:
        return
    now = time.time() if now is None else now
    pipe = client.pipeline()
    pipe.hdel(_key(service), _field(host, pid))
    pipe.set(_key(service) + ":exit", json.dumps({"pid": pid, "host": host, "at": now, "detail": detail}),
             ex=_KEEP_EXIT_S)
    pipe.execute()


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s ago" if seconds < 60 else f"{seconds / 60:.0f} min ago"


def _consumes(record: dict[str, Any], queue: str | None) -> bool:
    # A record without queues comes from a process that does not say (beat, or a worker from before queues were
    # recorded): it is counted for every queue rather than leaving a queue falsely without a worker.
    return queue is None or "queues" not in record or queue in record["queues"]


def service_state(service: str, now: float | None = None, *, queue: str | None = None) -> ServiceState:
    """Up, stale or down, with the reason; with ``queue``, only the processes that consume it count (a worker per
    queue). Raises the Redis client's error when Redis does not answer."""
    client = _redis()
    if client is None:
        return ServiceState(service, ok=True, tracked=False, state="untracked",
                            detail="not tracked: no Redis for heartbeats (HEARTBEAT_REDIS_URL)")
    now = time.time() if now is None else now
    pipe = client.pipeline()
    pipe.hgetall(_key(service))
    pipe.get(_key(service) + ":exit")
    raw_records, raw_exit = pipe.execute()
    records = sorted((r for r in (json.loads(v) for v in raw_records.values()) if _consumes(r, queue)),
                     key=lambda r: -float(r["seen_at"]))
    fresh = [r for r in records if now - float(r["seen_at"]) <= settings.SERVICE_HEARTBEAT_TIMEOUT_S]
    if fresh:
        newest = fresh[0]
        more = f" ({len(fresh)} processes)" if len(fresh) > 1 else ""
        age = max(0.0, now - float(newest["seen_at"]))
        queues = tuple(sorted({q for r in fresh for q in r.get("queues", ())}))
        return ServiceState(service, ok=True, pid=int(newest["pid"]), host=newest["host"], heartbeat_age_s=age,
                            since=float(newest["started_at"]), queues=queues,
                            detail=f"pid {newest['pid']}, heartbeat {_ago(age)}{more}")
    exited = json.loads(raw_exit) if raw_exit else None
    last_seen = float(records[0]["seen_at"]) if records else None
    if exited is not None and (last_seen is None or float(exited["at"]) >= last_seen):
        return ServiceState(service, ok=False, pid=int(exited["pid"]), host=exited["host"], state="down",
                            since=float(exited["at"]),
                            detail=f"pid {exited['pid']} {exited['detail']} {_ago(now - float(exited['at']))}")
    if last_seen is not None:
        return ServiceState(service, ok=False, pid=int(records[0]["pid"]), host=records[0]["host"],
                            heartbeat_age_s=now - last_seen, state="stale", since=last_seen,
                            detail=f"no heartbeat from pid {records[0]['pid']} for {now - last_seen:.0f} s")
    return ServiceState(service, ok=False, state="down", detail="no heartbeat yet: not running")


# --- the writer, in the worker's and beat's own process ---------------------------------------------------

_running: dict[str, tuple[threading.Event, threading.Thread]] = {}


def heartbeat_start(service: str, *, queues: tuple[str, ...] = ()) -> None:
    """Start this process's heartbeat thread for ``service`` (once per process); it stops at exit. A worker
    names the queues it consumes, so the dashboard can say which queue has no live worker."""
    if service in _running or _redis() is None:
        return
    stop = threading.Event()
    pid, host, started_at = os.getpid(), socket.gethostname(), time.time()

    def beat_forever() -> None:
        failing = False
        while True:
            try:
                service_beat(service, pid=pid, host=host, started_at=started_at, queues=queues)
                failing = False
            except Exception as exc:  # Redis away for a moment: say it once, keep trying
                if not failing:
                    log.warning("liveness: the %s heartbeat could not be written: %s", service, type(exc).__name__)
                failing = True
            if stop.wait(settings.SERVICE_HEARTBEAT_INTERVAL_S):
                return

    thread = threading.Thread(target=beat_forever, name=f"{service}-liveness", daemon=True)
    _running[service] = (stop, thread)
    thread.start()
    atexit.register(heartbeat_stop, service)


def heartbeat_stop(service: str) -> None:
    """A clean stop: no more heartbeats, and the record is removed (nobody reads a stopped service as hung)."""
    running = _running.pop(service, None)
    if running is None:
        return
    running[0].set()
    running[1].join(timeout=3)  # a write under way would otherwise put the record back after its removal
    try:
        service_forget(service, pid=os.getpid(), host=socket.gethostname())
    except Exception as exc:  # the record then ages out after the timeout
        log.warning("liveness: the %s record could not be removed: %s", service, type(exc).__name__)
