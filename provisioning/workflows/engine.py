"""Run a workflow: steps in order, each one's progress committed before and after it runs.

A run is executed by at most one worker at a time (PostgreSQL advisory lock on the run,
released by the server if the worker dies). A worker killed anywhere leaves the step
``running``; the next execution runs that step's ``ensure`` again, which is idempotent.

A run is a kind of the job kernel (``controlplane.jobs``, kind ``workflow-run``): the kernel holds that lease,
marks the run running, re-queues a failed step's ``RetryLater``, resumes a run from its one stall sweep after
``WORKFLOW_STALL_AFTER_S`` (each step's start and end move the run's ``updated_at``) and sleeps the test-only
pause ``PROVISIONING_PAUSE_AFTER_EFFECT_S`` (at ``PROVISIONING_PAUSE_STEP``). Steps, attempts and what a
failure means for the tenant stay here.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Exists, F
from django.utils import timezone

from controlplane.jobs import JobKind, RetryLater, job_drive, job_kind_register, job_pause, job_progress
from provisioning.choices import StepStatus, WorkflowKind, WorkflowStatus
from provisioning.models import WorkflowRun, WorkflowStep
from provisioning.recovery.steps import Unrecoverable
from provisioning.workflows.plans import STEPS
from provisioning.workflows.steps import StepContext
from tenants.actors import SYSTEM
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import Tenant

__all__ = ["RetryLater", "WORKFLOW_JOBS", "workflow_execute", "Outcome"]

log = logging.getLogger(__name__)

# Tenant states in which a workflow kind may keep going; anything else supersedes the run.
_ALLOWED_TENANT_STATES = {
    WorkflowKind.ONBOARD: {TenantStatus.PENDING, TenantStatus.PROVISIONING, TenantStatus.READY},
    WorkflowKind.DEPROVISION: {TenantStatus.DEPROVISIONING, TenantStatus.DELETED},
    WorkflowKind.RECOVER: {TenantStatus.RECOVERING, TenantStatus.READY},
    # A move may finish the switch and clean-up even if the tenant was marked degraded meanwhile.
    WorkflowKind.MOVE: {TenantStatus.READY, TenantStatus.DEGRADED},
}


def _max_attempts(kind: str) -> int:
    # A recovery is not retried step by step: a failed recovery counts towards backoff and quarantine.
    return 1 if kind == WorkflowKind.RECOVER else settings.WORKFLOW_STEP_MAX_ATTEMPTS


class Outcome:
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BUSY = "busy"  # another worker holds the run (the kernel's answer)
    FINISHED = "finished"  # nothing to do (the kernel's answer)


def _clip(text: str) -> str:
    # Errors are stored and shown to staff and operators. Drivers never put secrets in exception
    # messages (passwords travel as SCRAM verifiers, instance logs are secret-free JSON); this only bounds size.
    return text[:2000]


def workflow_execute(run_id: str) -> str:
    """Execute (or resume) a run. Raises RetryLater when a step failed and should be retried."""
    return job_drive(WORKFLOW_JOBS, run_id)


def _run(run_id: str) -> str:
    """The kind's body: the kernel holds the lease and has marked the run running."""
    run = WorkflowRun.objects.select_related("tenant", "tenant__operator").get(pk=run_id)
    functions = dict(STEPS[run.kind])
    for step in run.steps.order_by("position"):
        if step.status == StepStatus.DONE:
            continue
        if not _start_step(run, step):
            run.tenant.status = Tenant.objects.values_list("status", flat=True).get(pk=run.tenant_id)
            _finish(run, WorkflowStatus.FAILED, f"superseded: tenant is {run.tenant.status}")
            return Outcome.FAILED
        try:
            _execute_step(run, step, functions[step.name])
        except _Failed:
            return Outcome.FAILED
    _finish(run, WorkflowStatus.SUCCEEDED)
    return Outcome.SUCCEEDED


WORKFLOW_JOBS = job_kind_register(JobKind(
    name="workflow-run", model=WorkflowRun, active_statuses=(WorkflowStatus.PENDING, WorkflowStatus.RUNNING),
    run=_run, running_status=WorkflowStatus.RUNNING, marks_started=False, stall_after_s="WORKFLOW_STALL_AFTER_S",
    pause_setting="PROVISIONING_PAUSE_AFTER_EFFECT_S", pause_step_setting="PROVISIONING_PAUSE_STEP",
))


def _start_step(run: WorkflowRun, step: WorkflowStep) -> bool:
    """Commit the step's new attempt, but only while the tenant is still in a state this workflow may act
    on (e.g. not deprovisioning under an onboarding). One statement: the check and the mark cannot race."""
    now = timezone.now()
    allowed = Tenant.objects.filter(pk=run.tenant_id, status__in=_ALLOWED_TENANT_STATES[run.kind])
    started = WorkflowStep.objects.filter(pk=step.pk).filter(Exists(allowed)).update(
        status=StepStatus.RUNNING, attempts=F("attempts") + 1, started_at=now, error="")
    if started:
        step.status, step.attempts, step.started_at, step.error = StepStatus.RUNNING, step.attempts + 1, now, ""
        job_progress(WORKFLOW_JOBS, run.pk)  # the run moved: the stall sweep leaves it alone
    return bool(started)


def _execute_step(run: WorkflowRun, step: WorkflowStep, fn: object) -> None:
    try:
        output = fn(StepContext(tenant=run.tenant, run=run))  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, then retried or failed
        message = _clip(f"{exc.__class__.__name__}: {exc}")
        log.warning("workflow %s step %s attempt %s failed: %s", run.pk, step.name, step.attempts, message)
        step.error = message
        if step.attempts >= _max_attempts(run.kind) or isinstance(exc, Unrecoverable):
            step.status = StepStatus.FAILED
            step.finished_at = timezone.now()
            step.save(update_fields=["status", "error", "finished_at"])
            _finish(run, WorkflowStatus.FAILED, f"step {step.name} failed: {message}",
                    unrecoverable=isinstance(exc, Unrecoverable))
            raise _Failed() from None
        step.status = StepStatus.PENDING
        step.save(update_fields=["status", "error"])
        raise RetryLater(
            countdown=settings.WORKFLOW_RETRY_BACKOFF_S * 2 ** (step.attempts - 1), reason=message
        ) from None
    job_pause(WORKFLOW_JOBS, step=step.name)  # chaos tests kill the worker here
    step.status = StepStatus.DONE
    step.output = output
    step.finished_at = timezone.now()
    step.save(update_fields=["status", "output", "finished_at"])
    job_progress(WORKFLOW_JOBS, run.pk)


class _Failed(Exception):
    pass


def _finish(run: WorkflowRun, status: str, error: str = "", *, unrecoverable: bool = False) -> None:
    run.status = status
    run.error = error
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "finished_at", "updated_at"])
    if status != WorkflowStatus.FAILED or error.startswith("superseded"):
        return
    if run.kind == WorkflowKind.RECOVER:
        from provisioning.recovery.sweep import recovery_failed

        recovery_failed(run=run, error=error, unrecoverable=unrecoverable)
    elif run.kind == WorkflowKind.MOVE:
        from provisioning.databases.move import database_move_failed

        database_move_failed(run=run, error=error)  # the tenant stays where it was: not a failed tenant
    elif run.tenant.status not in (TenantStatus.FAILED, TenantStatus.DELETED):
        tenant_transition(tenant=run.tenant, to=TenantStatus.FAILED, actor=SYSTEM, reason=error)
