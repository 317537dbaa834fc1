"""The queue of effects waiting for a human (in doubt or blocked) across tenants, for the staff dashboard.

Effects live in each tenant's own schema and only its instance reads them, so the queue asks instances:
at most ``EFFECT_QUEUE_TENANTS`` tenants per page (the ones whose agent can answer, in a stable order),
in parallel, and keeps what came back within ``DASHBOARD_EFFECT_QUEUE_DEADLINE_S``. Tenants that did not answer
are listed as such, never silently dropped. Reads only.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from conversations.screens import CHAT_STATUSES, when
from conversations.selectors import effect_list
from tenants.models import Tenant

__all__ = ["EffectQueue", "effect_queue", "effect_queue_deadline_s", "EFFECT_QUEUE_TENANTS"]

log = logging.getLogger(__name__)

EFFECT_QUEUE_TENANTS: int = settings.DASHBOARD_EFFECT_QUEUE_TENANTS
_WORKERS = 8
_PER_TENANT = 50


@dataclass
class EffectQueue:
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"tenant", "effect"}
    asked: list[Tenant] = field(default_factory=list)
    unanswered: list[tuple[Tenant, str]] = field(default_factory=list)  # (tenant, why)
    total_tenants: int = 0
    page: int = 1
    cap: int = EFFECT_QUEUE_TENANTS

    @property
    def first(self) -> int:
        return (self.page - 1) * self.cap + 1

    @property
    def last(self) -> int:
        return self.first + len(self.asked) - 1

    @property
    def has_next(self) -> bool:
        return self.page * self.cap < self.total_tenants


def _ask(tenant: Tenant) -> list[dict[str, Any]]:
    try:
        return list(effect_list(tenant=tenant, state="open", limit=_PER_TENANT).get("effects", []))
    finally:
        connection.close()  # this worker thread's own connection


def effect_queue_deadline_s() -> float:
    """Read per request, not at import: a settings change (or a test's override) applies without a restart."""
    return float(settings.DASHBOARD_EFFECT_QUEUE_DEADLINE_S)


def effect_queue(*, page: int = 1, cap: int = EFFECT_QUEUE_TENANTS, deadline_s: float | None = None) -> EffectQueue:
    if deadline_s is None:
        deadline_s = effect_queue_deadline_s()
    tenants = (Tenant.objects.filter(status__in=CHAT_STATUSES, instance__isnull=False)
               .select_related("operator").order_by("operator__slug", "slug", "id"))
    page = max(1, page)
    queue = EffectQueue(total_tenants=tenants.count(), page=page, cap=cap)
    queue.asked = list(tenants[(page - 1) * cap: page * cap])
    if not queue.asked:
        return queue
    pool = ThreadPoolExecutor(max_workers=min(_WORKERS, len(queue.asked)), thread_name_prefix="effect-queue")
    futures = {pool.submit(_ask, t): t for t in queue.asked}
    done, _ = wait(futures, timeout=deadline_s)
    pool.shutdown(wait=False, cancel_futures=True)
    for future, tenant in futures.items():
        if future not in done:
            queue.unanswered.append((tenant, f"no answer within {deadline_s:g} s"))
            continue
        exc = future.exception()
        if exc is not None:
            detail = getattr(exc, "detail", "") or type(exc).__name__
            if not hasattr(exc, "detail"):
                log.warning("effect queue: reading %s failed", tenant.pk, exc_info=exc)
            queue.unanswered.append((tenant, str(detail)))
            continue
        for effect in future.result():
            queue.rows.append({"tenant": tenant, "effect": {**effect, "created": when(effect.get("created_at"))}})
    queue.rows.sort(key=lambda r: str(r["effect"].get("created_at") or ""))
    queue.unanswered.sort(key=lambda pair: (pair[0].operator.slug, pair[0].slug))
    return queue
