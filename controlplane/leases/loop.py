"""``leader_loop``: run a long-lived loop (a watcher) only while this process holds a lease; stand by otherwise.

The loop is anything with ``run()`` (blocks until stopped) and ``stop()`` (thread-safe). Each time this process
takes the lease, a fresh one is made (``start()``) and run in its own thread; this thread renews the lease every
``LEADER_RENEW_S`` and stops the loop the moment a renewal is refused (another holder: this process was frozen or
cut off past the period) or the lease's period runs out without one (the database cannot be reached). A loop
that returns on its own is started again while the lease is held. On ``stopping`` the loop is stopped and the
lease given back, so a standby takes over at its next attempt instead of a period later.

A fresh loop per term, not a resumed one: a watcher that was deposed missed events meanwhile, and starting over
(list, then watch) is what it does after any interruption.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from django.db import connection

from .lease import LeaderLease

__all__ = ["Loop", "leader_loop"]

log = logging.getLogger(__name__)


class Loop(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...


def leader_loop(lease: LeaderLease | str, start: Callable[[], Loop], *, stopping: threading.Event,
                role: str = "leader", progress: Callable[[str], None] | None = None) -> None:
    """Until ``stopping`` is set: lead (a fresh ``start()`` running) while holding ``lease``, else stand by."""
    lease = LeaderLease(lease) if isinstance(lease, str) else lease
    say = progress or (lambda message: log.info(message))
    standing_by = False
    try:
        while not stopping.is_set():
            if not lease.keep():
                if not standing_by:
                    say(f"another {role} holds the lease {lease.name!r}: standing by")
                    standing_by = True
                stopping.wait(lease.seconds_to_next_attempt() or lease.renew_s)
                continue
            standing_by = False
            say(f"holding the lease {lease.name!r} (epoch {lease.epoch}): the only {role}")
            _lead(lease, start(), stopping, say)
            if not stopping.is_set() and lease.held():
                stopping.wait(lease.renew_s)  # the loop ended by itself: not a busy restart
    finally:
        lease.release()
        connection.close()


def _lead(lease: LeaderLease, loop: Loop, stopping: threading.Event, say: Callable[[str], None]) -> None:
    thread = threading.Thread(target=loop.run, name=f"lead-{lease.name}", daemon=True)
    thread.start()
    try:
        while thread.is_alive() and not stopping.is_set():
            term = lease.term
            until_deadline = term.valid_until - time.monotonic() if term else 0.0
            stopping.wait(max(0.01, min(lease.seconds_to_next_attempt(), until_deadline)))
            if stopping.is_set():
                break
            if not lease.keep():
                say(f"lost the lease {lease.name!r}: stopping, standing by")
                break
    finally:
        loop.stop()
        thread.join()
