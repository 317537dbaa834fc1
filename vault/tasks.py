"""Celery tasks for the vault: none of its own any more.

Rotation jobs are a kind of the job kernel (``controlplane.jobs``): its one drive task runs them and its one sweep
resumes stalled ones. The archive expiry and shredding task keeps its name ``vault.tasks.*`` but lives in
``provisioning/tasks.py`` (it needs the drivers). The module stays so every app has the same rooms.
"""

from __future__ import annotations

__all__: list[str] = []
