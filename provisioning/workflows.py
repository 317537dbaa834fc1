"""Which steps each workflow kind runs, in order. The engine and services read this one table."""

from __future__ import annotations

from .choices import WorkflowKind
from .database_move import MOVE_STEPS
from .recovery_steps import STEPS as RECOVER_STEPS
from .steps import DEPROVISION_STEPS, ONBOARD_STEPS, StepFn

__all__ = ["STEPS"]

STEPS: dict[str, list[tuple[str, StepFn]]] = {
    WorkflowKind.ONBOARD: ONBOARD_STEPS,
    WorkflowKind.DEPROVISION: DEPROVISION_STEPS,
    WorkflowKind.RECOVER: RECOVER_STEPS,
    WorkflowKind.MOVE: MOVE_STEPS,
}
