"""The worker's side of beat's fencing: a periodic job sent by a deposed leader is dropped, not run.

``LeaderScheduler`` stamps each message with the epoch of the lease it held (header ``leader_epoch``). The lease
cannot close the gap between a leader's last ``held()`` check and its send (a process frozen in between, then
resumed after a standby took over); this closes it where the message is received: a worker runs a message only
when its epoch is still the lease's current one. Every task runs through ``FencedTask`` (the app's task class):
a message without the header (anything not sent by beat) runs as before.

Cost: one primary-key read of ``controlplane_lease`` per beat message (a few a second at most), none for an epoch
already known to be superseded (the newest epoch this process has seen is kept).

What is dropped: also a message the old leader sent *legitimately* just before it died, if it is received after the
takeover. Nothing is lost by it: every periodic job is a sweep that the next run (the new leader's) repeats in full,
and the new leader continues from the old one's last send.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from django.db import DatabaseError, connection

__all__ = ["BEAT_LEASE", "FencedTask", "superseded_by"]

log = logging.getLogger(__name__)

#: the lease ``LeaderScheduler`` holds (here, not in ``beat``: the app's task class loads before Django's models)
BEAT_LEASE = "beat"

_newest_seen: dict[str, int] = {}


def superseded_by(epoch: int, *, lease: str = BEAT_LEASE) -> int | None:
    """The lease's current epoch when ``epoch`` is older (its sender no longer leads), else None."""
    known = _newest_seen.get(lease, 0)
    if epoch < known:
        return known
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT epoch FROM controlplane_lease WHERE name = %s", [lease])
            row = cur.fetchone()
    except DatabaseError as exc:
        # Not checked, so run: every periodic job is safe to run twice, and one that cannot reach the database
        # fails on its own. The connection is dropped so the task (and the next check) opens a fresh one.
        log.warning("beat fencing: could not read the lease %r (%s): running the message", lease,
                    type(exc).__name__)
        connection.close()
        return None
    current = int(row[0]) if row else 0
    _newest_seen[lease] = max(known, current)
    return current if epoch < current else None


def _leader_epoch(request: Any) -> int | None:
    raw = getattr(request, "leader_epoch", None)
    if raw is None:
        raw = (getattr(request, "headers", None) or {}).get("leader_epoch")
    try:
        return None if raw is None else int(raw)
    except (TypeError, ValueError):
        return None


class FencedTask(Task):
    """Celery's task class, refusing a beat message from a leader that has been replaced."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        epoch = None if self.request.called_directly else _leader_epoch(self.request)
        if epoch is not None:
            current = superseded_by(epoch)
            if current is not None:
                log.warning("beat fencing: dropped %s (%s) sent by %s at epoch %d: the lease %r is at epoch %d",
                            self.name, self.request.id, getattr(self.request, "leader_holder", "?"), epoch,
                            BEAT_LEASE, current,
                            extra={"event": "beat_message_fenced", "task": self.name, "epoch": epoch,
                                   "current_epoch": current})
                raise Ignore()
        return super().__call__(*args, **kwargs)
