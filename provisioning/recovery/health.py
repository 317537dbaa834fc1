"""How an agent instance is doing, for the screens (staff dashboard, operator portal, fleet charts): its status,
a label (healthy, stale, recovering, ...), its last heartbeat and its progress in words.

Read-only: the live heartbeat store first, the instance row (synced every few seconds) when it has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from provisioning.choices import InstanceStatus
from provisioning.models import AgentInstance
from provisioning.recovery.heartbeats import heartbeat_store

__all__ = ["InstanceHealth", "describe_progress", "instance_health"]


@dataclass(frozen=True)
class InstanceHealth:
    status: str
    label: str  # healthy | stale | recovering | quarantined | <status>
    heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    progress: dict[str, Any]

    @property
    def progress_text(self) -> str:
        return describe_progress(self.progress)


_ACTIVITY = {"idle": "Idle, waiting for work", "working": "Working", "stalled": "Stalled",
             "stopping": "Stopping", "starting": "Starting", "ready": "Ready",
             "agent_load_failed": "The agent package failed to load"}


def describe_progress(progress: dict[str, Any]) -> str:
    """The heartbeat's progress marker as a sentence for people ("Working on task 1a2b3c4d, step `charge`,
    last checkpoint 12"), never ``step=None, task=None``; fields that are empty are left out."""
    status = str(progress.get("status") or "")
    task, step, checkpoint = progress.get("task"), progress.get("step"), progress.get("checkpoint")
    words = _ACTIVITY.get(status, status.capitalize() if status else "")
    parts = []
    if task:
        parts.append(f"on task {str(task)[:8]}")
    if step not in (None, ""):
        parts.append(f"step {step}")
    sentence = " ".join(filter(None, [words or ("Working" if task else ""), ", ".join(parts)]))
    if checkpoint not in (None, ""):
        sentence += f"{',' if sentence else ''} last checkpoint {checkpoint}"
    return sentence.strip() or "No progress reported yet"


def instance_health(instance: AgentInstance | None, now: datetime | None = None) -> InstanceHealth | None:
    if instance is None:
        return None
    now = now or timezone.now()
    beat = heartbeat_store().get(str(instance.pk))  # live (Redis); the row is synced every few seconds
    heartbeat_at = datetime.fromtimestamp(beat.seen_at, tz=UTC) if beat else instance.last_heartbeat_at
    progress = beat.progress if beat else (instance.progress or {})
    age = (now - heartbeat_at).total_seconds() if heartbeat_at else None
    label = instance.status
    if instance.status == InstanceStatus.RUNNING:
        label = "stale" if age is not None and age > settings.DASHBOARD_HEARTBEAT_STALE_S else "healthy"
    return InstanceHealth(status=instance.status, label=label, heartbeat_at=heartbeat_at,
                          heartbeat_age_s=age, progress={k: v for k, v in progress.items() if not k.startswith("_")})
