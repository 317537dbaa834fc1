"""The vault's periodic jobs, as one list like provisioning's: registered by migrations and ``schedules_ensure``."""

from __future__ import annotations

__all__ = ["SCHEDULES", "schedules_ensure"]

SCHEDULES: list[tuple[str, str, int]] = [
    # (name, task, every seconds)
    ("Resume stalled key rotations", "vault.tasks.resume_stalled_rotations", 30),
    # Hourly: archives expire by the day; a run is one listing of the archive prefix plus what expired.
    ("Expire archives and shred retired data keys", "vault.tasks.archives_expire_and_shred_task", 3600),
]


def schedules_ensure() -> int:
    """(Re)register the vault's periodic jobs; existing entries keep any interval staff changed."""
    from django.apps import apps

    from controlplane.beat import register_periodic_tasks

    return register_periodic_tasks(apps, SCHEDULES, keep_existing=True)
