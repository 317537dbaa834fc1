"""The plan's monthly limits (``Plan.max_tasks_per_month``, ``max_tokens_per_month``) and this month's use of them.

The inbox enforces them (``conversations.services`` refuses a new task or message with 429
``monthly-limit-reached`` in the statement that inserts it), so the numbers the portal, the dashboard and
``GET /api/v1/tenants/{id}/usage/limits`` show are counted here, the way the inbox counts when it refuses: tasks
and messages in the inbox (exact at once), tokens from the collected usage (``usage``, a layer below: up to one
collection behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from tenants.models import Tenant
from usage.selectors import usage_month_tokens

from .choices import InboxKind
from .models import InboxItem

__all__ = ["MonthlyUse", "inbox_month_count", "month_window", "monthly_limits"]


def month_window(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The current UTC calendar month: its first instant and the next month's (when the monthly limits reset)."""
    now = (now or timezone.now()).astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    resets = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, resets


@dataclass(frozen=True)
class MonthlyUse:
    """One monthly limit of the tenant's plan and this month's usage against it (``limit`` None: unlimited)."""

    field: str  # the Plan field: max_tasks_per_month or max_tokens_per_month
    limit: int | None
    used: int
    resets_at: datetime

    @property
    def reached(self) -> bool:
        return self.limit is not None and self.used >= self.limit


def inbox_month_count(*, tenant: Tenant, since: datetime) -> int:
    """Tasks and messages accepted since ``since``: counted in the inbox, where the monthly limit is enforced
    (exact at once; the collected ``tasks_submitted`` lags by a collection)."""
    return InboxItem.objects.filter(tenant=tenant, kind__in=(InboxKind.TASK, InboxKind.MESSAGE),
                                    created_at__gte=since).count()


def monthly_limits(*, tenant: Tenant, now: datetime | None = None) -> list[MonthlyUse]:
    """The plan's monthly limits with this month's usage (the portal's card, ``GET /tenants/{id}/usage/limits``).
    Usage is counted the way the inbox counts it when it refuses, so the page and the 429 agree."""
    start, resets = month_window(now)
    plan = tenant.plan
    return [MonthlyUse("max_tasks_per_month", plan.max_tasks_per_month,
                       inbox_month_count(tenant=tenant, since=start), resets),
            MonthlyUse("max_tokens_per_month", plan.max_tokens_per_month,
                       usage_month_tokens(tenant=tenant, since=start.date()), resets)]
