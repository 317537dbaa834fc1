"""The dashboard's periodic job, as a list like provisioning's: registered by a migration and ``schedules_ensure``."""

from __future__ import annotations

__all__ = ["SCHEDULES", "schedules_ensure"]

SCHEDULES: list[tuple[str, str, int]] = [
    # (name, task, every seconds): a minute resolves a recovery's dip while 7 days stay ~10k rows per tenant.
    ("Dashboard: sample heartbeat age and fleet status", "dashboard.tasks.history_sample_task", 60),
]


def schedules_ensure() -> int:
    """(Re)register the sampler; an entry staff changed keeps its interval."""
    from django.apps import apps

    from controlplane.beat import register_periodic_tasks

    return register_periodic_tasks(apps, SCHEDULES, keep_existing=True)
