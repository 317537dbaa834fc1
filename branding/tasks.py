"""Celery tasks for branding: none of its own any more.

Submissions (``branding-revision``) and rollouts (``branding-rollout``) are kinds of the job kernel
(``controlplane.jobs``): its one drive task runs them and its one sweep resumes stalled ones. The module stays so
every app has the same rooms.
"""

from __future__ import annotations

__all__: list[str] = []
