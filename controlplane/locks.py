"""PostgreSQL session advisory locks: one holder at a time across every worker and beat process.

The server releases the lock when the holder's connection drops, so a SIGKILLed worker never
leaves a lock behind.
"""

from __future__ import annotations

from django.db import connection

__all__ = ["AdvisoryLock"]


class AdvisoryLock:
    def __init__(self, name: str) -> None:
        self.name, self.held = name, False

    def __enter__(self) -> AdvisoryLock:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [self.name])
            self.held = bool(cur.fetchone()[0])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", [self.name])
