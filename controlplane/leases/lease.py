"""``LeaderLease``: take, renew and give back one named lease; tell whether it is still ours right now.

Why a deposed leader cannot act (the whole argument, also in docs/production.md):

1. Expiry is judged by one clock only, the database's (``clock_timestamp()`` inside the statement). A standby
   takes the lease only when that clock is past ``expires_at``; machines' wall clocks never enter.
2. The holder measures its own validity with its monotonic clock, from *before* it sent the renewal:
   ``valid_until = started + period - margin``. The database set ``expires_at`` to its clock at the statement
   plus ``period``, and the statement ran after ``started``, so (clocks ticking at the same rate, which is what
   the margin absorbs) the holder's deadline passes before any standby can take over.
3. The holder checks ``held()`` right before each action and renews every ``renew_s`` (well inside the period).
   A renewal the database refuses (someone else holds it: we were stopped or cut off past the period) drops the
   lease at once; a renewal that cannot reach the database keeps the lease until its deadline, then drops it.
4. What remains is the gap between ``held()`` and the action itself (a process frozen in between). That is what
   the epoch is for: it travels with what the leader sends (beat: the ``leader_epoch`` header), and what the
   leader drives is idempotent anyway (sweeps, fire rows unique per fire time, jobs resumed by the kernel).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connection

__all__ = ["LeaderLease", "Term", "default_holder"]

log = logging.getLogger(__name__)

# Take (free or expired), renew (ours) or refuse, in one statement; the row is created on first use.
_TAKE_OR_RENEW = """
INSERT INTO controlplane_lease AS l (name, holder, epoch, expires_at, acquired_at)
VALUES (%(name)s, %(holder)s, 1, clock_timestamp() + make_interval(secs => %(period)s), clock_timestamp())
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp()
                 THEN l.epoch ELSE l.epoch + 1 END,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp()
                       THEN l.acquired_at ELSE clock_timestamp() END,
    holder = EXCLUDED.holder,
    expires_at = clock_timestamp() + make_interval(secs => %(period)s)
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp()
RETURNING l.epoch
"""

_RELEASE = """
UPDATE controlplane_lease SET expires_at = clock_timestamp()
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
"""


def default_holder() -> str:
    """This process, uniquely: a restarted process that reuses a pid is another holder."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Term:
    """One holder's hold of the lease: its epoch and the monotonic instant it must stop acting by."""

    epoch: int
    valid_until: float


class LeaderLease:
    """One process's view of the lease ``name``. Not thread-safe: one thread takes and renews it."""

    def __init__(self, name: str, *, period_s: float | None = None, renew_s: float | None = None,
                 holder: str | None = None) -> None:
        self.name = name
        self.period_s = float(settings.LEADER_LEASE_S if period_s is None else period_s)
        self.renew_s = float(settings.LEADER_RENEW_S if renew_s is None else renew_s)
        if not 0 < self.renew_s < self.period_s / 2:
            raise ValueError(f"lease {name!r}: renew every {self.renew_s:g} s must be under half the period "
                             f"({self.period_s:g} s), so one late renewal does not lose it")
        # What the holder's clock may run slow against the database's over one period, plus a scheduling hiccup.
        self.margin_s = min(0.5, self.period_s * 0.1)
        self.holder = holder or default_holder()
        self.term: Term | None = None
        self._last_attempt: float | None = None

    @property
    def epoch(self) -> int | None:
        return self.term.epoch if self.term else None

    def held(self) -> bool:
        """Whether this process may act as the leader right now (no database call)."""
        return self.term is not None and time.monotonic() < self.term.valid_until

    def due(self) -> bool:
        """Whether it is time to renew (held) or to try again (not held)."""
        return self._last_attempt is None or time.monotonic() - self._last_attempt >= self.renew_s

    def seconds_to_next_attempt(self) -> float:
        if self._last_attempt is None:
            return 0.0
        return max(0.0, self._last_attempt + self.renew_s - time.monotonic())

    def keep(self) -> bool:
        """Take or renew the lease when due; whether it is held now. The one call a leader's loop makes."""
        if self.due():
            self.take_or_renew()
        return self.held()

    def take_or_renew(self) -> Term | None:
        """One attempt: the term held after it (None: another holder has it). A database that cannot be reached
        keeps the current term until its deadline (nobody else can take it meanwhile)."""
        started = self._last_attempt = time.monotonic()
        try:
            with connection.cursor() as cur:
                cur.execute(_TAKE_OR_RENEW, {"name": self.name, "holder": self.holder, "period": self.period_s})
                row = cur.fetchone()
        except DatabaseError as exc:
            log.warning("lease %s: could not renew (%s)", self.name, type(exc).__name__)
            connection.close()
            if self.term is not None and not self.held():
                self._lost("its period ran out without a renewal")
            return self.term if self.held() else None
        if row is None:
            if self.term is not None:
                self._lost("another holder has it")
            return None
        epoch = int(row[0])
        if self.term is None or self.term.epoch != epoch:
            log.info("lease %s: taken by %s (epoch %d)", self.name, self.holder, epoch,
                     extra={"event": "lease_taken", "lease": self.name, "epoch": epoch})
        self.term = Term(epoch, started + self.period_s - self.margin_s)
        return self.term

    def release(self) -> None:
        """Give the lease back (a clean shutdown): a standby takes it at its next attempt, not a period later."""
        term, self.term = self.term, None
        if term is None:
            return
        try:
            with connection.cursor() as cur:
                cur.execute(_RELEASE, {"name": self.name, "holder": self.holder, "epoch": term.epoch})
        except DatabaseError as exc:
            log.warning("lease %s: could not release (%s); it expires on its own", self.name, type(exc).__name__)

    def _lost(self, why: str) -> None:
        log.warning("lease %s: %s lost it (epoch %s): %s", self.name, self.holder, self.epoch, why,
                    extra={"event": "lease_lost", "lease": self.name, "epoch": self.epoch})
        self.term = None
