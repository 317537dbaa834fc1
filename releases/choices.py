"""Named statuses of release rollouts and of each tenant's place in one."""

from __future__ import annotations

from django.db import models


class RolloutStatus(models.TextChoices):
    RUNNING = "running"  # upgrading a wave or soaking it under the health gate
    PAUSED = "paused"  # stopped between tenants on request; resume continues where it was
    ROLLING_BACK = "rolling_back"  # a wave failed its gate (or rollback was asked): every upgraded tenant goes back
    SUCCEEDED = "succeeded"  # every tenant upgraded and healthy; the release is the operator's default
    ROLLED_BACK = "rolled_back"  # finished rolling back: every upgraded tenant runs its previous release again
    ABORTED = "aborted"  # stopped on request; upgraded tenants keep the new release, the rest were never touched


ACTIVE_ROLLOUT_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.ROLLING_BACK)
# What the workflow acts on; a paused rollout waits for resume.
WORKING_ROLLOUT_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.ROLLING_BACK)


# Which statuses each action on a rollout is allowed from (enforced by ``releases.rollouts``, offered by the
# screens); rollback is also refused once a later rollout of the operator has started.
ROLLOUT_ACTION_STATUSES: dict[str, tuple[str, ...]] = {
    "pause": (RolloutStatus.RUNNING,),
    "resume": (RolloutStatus.PAUSED,),
    "abort": (RolloutStatus.RUNNING, RolloutStatus.PAUSED),
    "rollback": (RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.SUCCEEDED, RolloutStatus.ABORTED),
}


class ItemStatus(models.TextChoices):
    PENDING = "pending"  # not touched yet
    UPGRADING = "upgrading"  # its instance is being stopped at a step boundary and started on the new release
    UPGRADED = "upgraded"  # runs the new release (booted with it); soaking under the gate
    FAILED = "failed"  # the upgrade or the gate failed for this tenant (the reason is on the item)
    ROLLED_BACK = "rolled_back"  # back on its previous release
    SKIPPED = "skipped"  # left alone: pinned, suspended or deleted since the rollout was planned


# Items whose instance may run the new release: what a rollback returns to the previous one.
TOUCHED_ITEM_STATUSES = (ItemStatus.UPGRADING, ItemStatus.UPGRADED, ItemStatus.FAILED)
