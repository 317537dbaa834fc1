"""Which steps each workflow kind runs, in order. The engine and services read this one table."""

from __future__ import annotations

from provisioning.choices import WorkflowKind
from provisioning.databases.move import MOVE_STEPS
from provisioning.recovery.steps import STEPS as RECOVER_STEPS
from provisioning.workflows.steps import DEPROVISION_STEPS, ONBOARD_STEPS, StepFn

__all__ = ["STEPS"]

STEPS: dict[str, list[tuple[str, StepFn]]] = {
    WorkflowKind.ONBOARD: ONBOARD_STEPS,
    WorkflowKind.DEPROVISION: DEPROVISION_STEPS,
    WorkflowKind.RECOVER: RECOVER_STEPS,
    WorkflowKind.MOVE: MOVE_STEPS,
}
