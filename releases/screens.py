"""Reads of releases and rollouts for the screens (portal and dashboard): what each tenant runs, a rollout's
counts and items, the actions its status allows. No writes here: nothing creates a tenant's assignment on a
page view (``releases.assignments.tenant_release_initial`` does that on the tenant's next start).

Scoping stays with the callers: the portal passes its operator's objects (looked up through
``releases.selectors``), the dashboard any operator's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db.models import Count

from provisioning.fleet.actions import RESTARTABLE
from releases.assignments import booted_release
from releases.choices import ACTIVE_ROLLOUT_STATUSES, ROLLOUT_ACTION_STATUSES, ItemStatus
from releases.models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout, RolloutItem
from tenants.models import Operator, Tenant

__all__ = ["TenantRelease", "tenant_releases", "tenant_release", "default_release", "rollout_counts",
           "count_rows", "rollout_items", "rollout_is_active", "rollout_actions_allowed", "ROLLOUT_ACTION_STATUSES",
           "RUNTIME_AGENTS"]

RUNTIME_AGENTS = "runtime agents"  # what a tenant without a release runs: the agents installed with the runtime

@dataclass(frozen=True)
class TenantRelease:
    """What a tenant is assigned: ``version`` None is the runtime agents; ``assigned`` False means it has no
    record yet (one recorded at its first start: the operator's default then, the runtime agents for an
    instance that ran before releases existed)."""

    version: str | None
    release_id: Any
    pinned: bool
    assigned: bool

    @property
    def label(self) -> str:
        return self.version or RUNTIME_AGENTS


_UNASSIGNED = TenantRelease(version=None, release_id=None, pinned=False, assigned=False)


def tenant_releases(tenants: Iterable[Tenant]) -> dict[Any, TenantRelease]:
    """Tenant id -> its release, in one query (for a page of a list)."""
    ids = [t.pk for t in tenants]
    found = {a.tenant_id: TenantRelease(version=a.release.version if a.release else None, release_id=a.release_id,
                                        pinned=a.pinned, assigned=True)
             for a in ReleaseAssignment.objects.filter(tenant_id__in=ids).select_related("release")}
    return {pk: found.get(pk, _UNASSIGNED) for pk in ids}


def tenant_release(tenant: Tenant, *, with_boot: bool = False) -> dict[str, Any]:
    """The tenant's release for its page; ``with_boot``: also what its instance last booted with (read from the
    instance's own boot records; None when it never booted, is not running, or they cannot be read now)."""
    row = tenant_releases([tenant])[tenant.pk]
    booted = None
    if with_boot and tenant.status in RESTARTABLE:
        try:
            _boots, booted = booted_release(tenant, since=None)
        except psycopg.Error:
            booted = None  # the page still opens when the tenant's schema cannot be reached
    return {"assigned": row, "booted": booted, "booted_label": (booted or {}).get("version") or RUNTIME_AGENTS,
            "booted_known": with_boot and tenant.status in RESTARTABLE}


def default_release(operator: Operator) -> AgentRelease | None:
    default = DefaultRelease.objects.filter(operator=operator).select_related("release").first()
    return default.release if default else None


def rollout_counts(rollouts: Iterable[Rollout]) -> dict[Any, dict[str, int]]:
    """Rollout id -> tenants by item status (every status present, zeros included), in one query."""
    ids = [r.pk for r in rollouts]
    counts: dict[Any, dict[str, int]] = {pk: dict.fromkeys(ItemStatus.values, 0) for pk in ids}
    for row in RolloutItem.objects.filter(rollout_id__in=ids).values("rollout_id", "status").annotate(n=Count("id")):
        counts[row["rollout_id"]][row["status"]] = row["n"]
    return counts


def count_rows(counts: dict[str, int], *, nonzero: bool = False) -> list[tuple[str, str, int]]:
    """(status, its words, tenants) in the statuses' order, for a template."""
    return [(status, label.lower(), counts.get(status, 0)) for status, label in ItemStatus.choices
            if counts.get(status, 0) or not nonzero]


def rollout_items(rollout: Rollout) -> list[RolloutItem]:
    return list(RolloutItem.objects.filter(rollout=rollout).select_related("tenant", "from_release")
                .order_by("wave", "id"))


def rollout_is_active(rollout: Rollout) -> bool:
    return rollout.status in ACTIVE_ROLLOUT_STATUSES


def rollout_actions_allowed(rollout: Rollout) -> list[str]:
    """The actions its status allows; rollback also not once a later rollout of the operator has started."""
    allowed = [name for name, statuses in ROLLOUT_ACTION_STATUSES.items() if rollout.status in statuses]
    if "rollback" in allowed and Rollout.objects.filter(operator_id=rollout.operator_id,
                                                        created_at__gt=rollout.created_at).exists():
        allowed.remove("rollback")
    return allowed
