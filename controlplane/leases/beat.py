"""``LeaderScheduler``: django-celery-beat's ``DatabaseScheduler`` that sends only while it holds the beat lease.

Run as many ``celery beat`` processes as you like (deploy: two replicas); each ticks, and each tick first takes
or renews the lease ``beat`` when due (``LEADER_RENEW_S``). A standby does nothing else: it never reads the
schedule or advances an entry. The leader checks the lease again right before each send, so a leader deposed
(its renewal refused) or cut off (its period ran out) sends nothing more, and becomes a standby.

No fire twice across a takeover: the leader writes an entry's ``last_run_at`` as soon as it sent it (not
every few minutes, as the stock scheduler does), and a new leader reads the schedule afresh from the database
before its first send, so it continues from its predecessor's last send instead of from its own stale copy.
Each message carries the leader's epoch and holder (headers ``leader_epoch``, ``leader_holder``) and when it
was sent (``leader_sent_at``, the sender's clock): a task can tell a stale leader's message, and a test or an
audit can count sends per interval.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from .fence import BEAT_LEASE
from .lease import LeaderLease

__all__ = ["BEAT_LEASE", "LeaderScheduler"]

log = logging.getLogger(__name__)


class LeaderScheduler(DatabaseScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lease = LeaderLease(BEAT_LEASE)
        self._leading = False
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.lease.keep():
            if self._leading:
                self._step_down()
            return self.lease.seconds_to_next_attempt() or self.lease.renew_s
        if not self._leading:
            self._step_up()
        delay = float(super().tick(*args, **kwargs))
        return min(delay, self.lease.seconds_to_next_attempt())

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if not self.lease.held():  # the period ran out since the tick began (a stall): not ours to send
            log.warning("beat: not sending %s: the lease %r is no longer held", entry.name, BEAT_LEASE)
            return
        super().apply_entry(entry, producer=producer)
        self._record_run(entry)

    def _record_run(self, entry: Any) -> None:
        """Write this send's ``last_run_at`` now: a successor continues from it. From the entry sent (its model
        holds the reserved run), not from ``_schedule``, which a schedule change (another beat starting writes
        its default entries) may have re-read from the database in between: that copy still has the run before,
        and the stock ``sync`` would write it back and the rebuilt heap would send this run again."""
        self._dirty.discard(entry.name)
        try:
            entry.save()
        except (DatabaseError, ObjectDoesNotExist) as exc:
            log.warning("beat: could not record the run of %s (%s)", entry.name, type(exc).__name__)
        current = (self._schedule or {}).get(entry.name)
        if current is not None and current.model is not entry.model:
            current.model.last_run_at = current.last_run_at = entry.model.last_run_at
            current.model.total_run_count = current.total_run_count = entry.model.total_run_count

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        # The stock scheduler sends entry.options (its kwargs go nowhere): the headers go there, on this copy.
        headers = {**(entry.options.get("headers") or {}), "leader_epoch": self.lease.epoch,
                   "leader_holder": self.lease.holder, "leader_sent_at": time.time()}
        entry.options = {**entry.options, "headers": headers}
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.lease.release()  # a clean stop hands over at once

    def _step_up(self) -> None:
        """Leader from now: forget what this process knew of the schedule and read it from the database."""
        self._leading = True
        self._dirty.clear()
        self._schedule = self.all_as_schedule()
        self._heap = None
        log.info("beat: leading (lease %r, epoch %s, holder %s)", BEAT_LEASE, self.lease.epoch, self.lease.holder)

    def _step_down(self) -> None:
        self._leading = False
        self._dirty.clear()  # what it reserved but did not send is not written over its successor's runs
        self._heap = None
        log.warning("beat: standing by: lease %r lost", BEAT_LEASE)
