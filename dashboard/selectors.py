"""Reads for the staff dashboard: overview counts, tenant search, everything shown on a tenant page.

Read-only and never a secret: credentials appear as metadata (name, version, dates), keys as
versions and key-encryption-key ids.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from provisioning.choices import InstanceStatus, WorkflowStatus
from provisioning.models import AgentInstance, RecoveryEvent, WorkflowRun, WorkflowStep
from provisioning.selectors import recovery_event_list
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import AuditLog, Tenant

__all__ = [
    "overview",
    "control_plane_services",
    "tenant_search",
    "workflow_runs",
    "recovery_events",
    "audit_log",
]


def control_plane_services(now: datetime | None = None) -> dict[str, Any]:
    """The overview's "Processes" card: every process and dependency probed now (``process_health``: web, the
    database, broker and cache, the worker per queue and beat), the failing ones as the banner's sentences, and
    the supervisor's restarts of the last 24 hours."""
    from .process_health import process_health

    now = now or timezone.now()
    rows = process_health()
    restarts = AuditLog.objects.filter(action__in=(AuditAction.SERVICE_RESTART, AuditAction.SERVICE_GAVE_UP),
                                       created_at__gte=now - timedelta(hours=24))
    return {"rows": rows, "down": [r for r in rows if not r.ok],
            "restarts_24h": restarts.count(), "recent_restarts": list(restarts.order_by("-id")[:5])}


def overview() -> dict[str, Any]:
    now = timezone.now()
    by_status = dict(Tenant.objects.values_list("status").annotate(n=Count("id")))
    tenants = [(status, by_status.get(status, 0)) for status in TenantStatus.values]
    stale_before = now - timedelta(seconds=settings.DASHBOARD_HEARTBEAT_STALE_S)
    running = AgentInstance.objects.filter(status=InstanceStatus.RUNNING)
    instances = {
        "healthy": running.filter(Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__gte=stale_before)).count(),
        "stale": running.filter(last_heartbeat_at__lt=stale_before).count(),
        "recovering": AgentInstance.objects.filter(status=InstanceStatus.RECOVERING).count(),
        "quarantined": AgentInstance.objects.filter(status=InstanceStatus.QUARANTINED).count(),
        "other": AgentInstance.objects.exclude(
            status__in=(InstanceStatus.RUNNING, InstanceStatus.RECOVERING, InstanceStatus.QUARANTINED)).count(),
    }
    recoveries = RecoveryEvent.objects.filter(detected_at__gte=now - timedelta(hours=24)).count()
    failed_runs = WorkflowRun.objects.filter(status=WorkflowStatus.FAILED)
    return {
        "tenants": tenants,
        "tenants_total": sum(n for _, n in tenants),
        "instances": instances,
        "recoveries_24h": recoveries,
        "workflows_failed": failed_runs.count(),
        "recent_failed": failed_runs.select_related("tenant", "tenant__operator").order_by("-updated_at")[:8],
        "services": control_plane_services(now),
        "now": now,
    }


def tenant_search(*, q: str = "", status: str = "", operator: str = "", failed_workflows: bool = False,
                  ) -> QuerySet[Tenant]:
    # The list shows each tenant's operator, instance and plan: one join each, not a query per row.
    qs = Tenant.objects.select_related("operator", "instance", "plan").order_by("-created_at", "id")
    if status in TenantStatus.values:
        qs = qs.filter(status=status)
    if operator:
        qs = qs.filter(operator__slug=operator)
    if failed_workflows:
        qs = qs.filter(workflow_runs__status=WorkflowStatus.FAILED).distinct()
    q = q.strip()
    if q:
        match = Q(slug__icontains=q) | Q(name__icontains=q) | Q(operator__slug__icontains=q)
        try:
            match |= Q(pk=uuid.UUID(q))
        except ValueError:
            pass
        qs = qs.filter(match)
    return qs


def workflow_runs(tenant: Tenant, limit: int = 5) -> list[WorkflowRun]:
    runs = list(WorkflowRun.objects.filter(tenant=tenant).order_by("-created_at")
                .prefetch_related(Prefetch("steps", queryset=WorkflowStep.objects.order_by("position")))[:limit])
    for run in runs:
        run.step_list = list(run.steps.all())
    return runs


def recovery_events(tenant: Tenant, limit: int = 10) -> list[RecoveryEvent]:
    return list(recovery_event_list(tenant=tenant)[:limit])


def audit_log(tenant: Tenant) -> QuerySet[AuditLog]:
    return AuditLog.objects.filter(tenant=tenant).order_by("-id")
