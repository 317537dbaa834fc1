"""Celery tasks for releases: none of their own any more.

Release rollouts are a kind of the job kernel (``controlplane.jobs``, ``release-rollout``): its one drive task runs
them and its one sweep resumes stalled ones. The module stays so every app has the same rooms.
"""

from __future__ import annotations

__all__: list[str] = []
