"""``/healthz`` (liveness: the process answers) and ``/readyz`` (readiness: what it depends on answers).

A control plane whose database or broker is down, or whose Celery worker or beat is dead, is alive but
useless: nothing it accepts gets done. ``/readyz`` says so, and whoever looks reads which part is missing, in
one sentence, as problem+json. The worker and beat are judged by their own heartbeats (``liveness``), not by
whether something answers on their behalf. Each check is bounded by a short timeout so the probe itself never
hangs, and names the dependency and the error class only: URLs, addresses and user names never appear (the log
has them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from .liveness import SERVICES, ServiceState, service_state
from .problems import PROBLEM_CONTENT_TYPE, TYPE_BASE

__all__ = ["Check", "ServiceDown", "check_sentence", "readiness_checks", "service_check", "healthz", "readyz"]

TIMEOUT_S = 2.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    ms: float
    state: ServiceState | None = None  # a heartbeat-judged service's whole state (stale or down, since when)


class ServiceDown(Exception):
    """A service's own heartbeat says it is down; the message is the reason (no address in it)."""


def _timed(name: str, probe) -> Check:
    started = time.monotonic()
    try:
        detail = probe() or "ok"
        ok = True
    except ServiceDown as exc:
        detail, ok = str(exc), False
    except Exception as exc:  # a probe reports; it never raises
        # The response names the error class only (it is unauthenticated: no addresses, no user names); the
        # log has the whole message for whoever operates the control plane.
        log.warning("readiness: the %s does not answer: %s", name, exc)
        detail, ok = type(exc).__name__, False
    return Check(name, ok, detail, round((time.monotonic() - started) * 1000, 1))


def _database() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return "ok"


def _broker() -> str:
    from kombu.connection import Connection

    with Connection(settings.CELERY_BROKER_URL, connect_timeout=TIMEOUT_S,
                    transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}) as conn:
        conn.ensure_connection(max_retries=1, timeout=TIMEOUT_S)
    return "ok"


def _cache() -> str:
    key = "readyz:probe"
    cache.set(key, "1", timeout=10)
    if cache.get(key) != "1":
        raise RuntimeError("a value written was not read back")
    return settings.CACHES["default"]["BACKEND"].rsplit(".", 1)[-1]


def service_check(name: str, *, queue: str | None = None) -> Check:
    """One service judged by its heartbeats (``queue``: only the workers consuming it), bounded like any check;
    the check keeps the whole state for the dashboard, which says since when a service is stale or down."""
    seen: list[ServiceState] = []

    def probe() -> str:
        state = service_state(name, queue=queue)
        seen.append(state)
        if not state.ok:
            raise ServiceDown(state.detail)
        return state.detail

    check = _timed(name, probe)
    return replace(check, state=seen[0]) if seen else check


def readiness_checks() -> list[Check]:
    return [_timed("database", _database), _timed("broker", _broker), _timed("cache", _cache),
            *(service_check(name) for name in SERVICES)]


def check_sentence(check: Check) -> str:
    """What a failed check means, for the 503's detail and the dashboard."""
    if check.name in SERVICES:
        return f"the {check.name} is down ({check.detail})"
    return f"the {check.name} does not answer ({check.detail})"


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    checks = readiness_checks()
    body = {c.name: {"ok": c.ok, "detail": c.detail, "ms": c.ms} for c in checks}
    failed = [c for c in checks if not c.ok]
    if not failed:
        return JsonResponse({"status": "ready", "checks": body})
    detail = "; ".join(check_sentence(c) for c in failed)
    return JsonResponse({"type": TYPE_BASE + "not-ready", "title": "Not ready", "status": 503, "detail": detail,
                         "instance": request.path, "checks": body},
                        status=503, content_type=PROBLEM_CONTENT_TYPE, headers={"Retry-After": "5"})
