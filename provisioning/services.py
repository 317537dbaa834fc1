"""Provisioning writes: start, retry and resume workflows. Tasks are queued only after commit."""

from __future__ import annotations

from django.db import transaction

from controlplane.errors import Conflict
from controlplane.jobs import job_start
from provisioning.choices import StepStatus, WorkflowKind, WorkflowStatus
from provisioning.models import WorkflowRun, WorkflowStep
from provisioning.workflows.engine import WORKFLOW_JOBS
from provisioning.workflows.plans import STEPS
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant

__all__ = ["workflow_start", "workflow_retry", "workflow_enqueue"]


# The audit actions of starting and retrying each kind of run.
_START_ACTIONS = {
    WorkflowKind.ONBOARD: AuditAction.WORKFLOW_ONBOARD_START,
    WorkflowKind.DEPROVISION: AuditAction.WORKFLOW_DEPROVISION_START,
    WorkflowKind.RECOVER: AuditAction.WORKFLOW_RECOVER_START,
    WorkflowKind.MOVE: AuditAction.WORKFLOW_MOVE_START,
}
_RETRY_ACTIONS = {
    WorkflowKind.ONBOARD: AuditAction.WORKFLOW_ONBOARD_RETRY,
    WorkflowKind.DEPROVISION: AuditAction.WORKFLOW_DEPROVISION_RETRY,
    WorkflowKind.RECOVER: AuditAction.WORKFLOW_RECOVER_RETRY,
    WorkflowKind.MOVE: AuditAction.WORKFLOW_MOVE_RETRY,
}


def workflow_enqueue(run: WorkflowRun) -> None:
    """Queue a drive of the run once the transaction commits (the job kernel's one drive task)."""
    job_start(WORKFLOW_JOBS, run.pk)


def workflow_start(*, tenant: Tenant, kind: str, actor: Actor) -> WorkflowRun:
    """Create a run with all its steps pending and queue it once the transaction commits."""
    with transaction.atomic():
        run = WorkflowRun.objects.create(tenant=tenant, kind=kind)
        WorkflowStep.objects.bulk_create(
            [WorkflowStep(run=run, name=name, position=i) for i, (name, _) in enumerate(STEPS[kind])]
        )
        audit_record(actor=actor, action=_START_ACTIONS[WorkflowKind(kind)], target=run, tenant=tenant)
        workflow_enqueue(run)
    return run


def workflow_retry(*, run: WorkflowRun, actor: Actor) -> WorkflowRun:
    """Staff action: give a failed run's failed step a fresh set of attempts and queue it again."""
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().select_related("tenant").get(pk=run.pk)
        if run.status != WorkflowStatus.FAILED:
            raise Conflict(f"only a failed workflow can be retried (this one is {run.status})")
        if run.kind == WorkflowKind.ONBOARD and run.tenant.status == TenantStatus.FAILED:
            tenant_transition(tenant=run.tenant, to=TenantStatus.PROVISIONING, actor=actor, reason="retry")
        elif run.kind == WorkflowKind.DEPROVISION and run.tenant.status == TenantStatus.FAILED:
            tenant_transition(tenant=run.tenant, to=TenantStatus.DEPROVISIONING, actor=actor, reason="retry")
        run.steps.exclude(status=StepStatus.DONE).update(status=StepStatus.PENDING, attempts=0, error="")
        run.status = WorkflowStatus.PENDING
        run.error = ""
        run.finished_at = None
        run.save(update_fields=["status", "error", "finished_at", "updated_at"])
        audit_record(actor=actor, action=_RETRY_ACTIONS[WorkflowKind(run.kind)], target=run, tenant=run.tenant)
        workflow_enqueue(run)
    return run
