"""Django's PostgreSQL backend, with a health check that sends nothing while the connection looks healthy.

``CONN_HEALTH_CHECKS`` makes Django check a persistent connection at the first query of every request; the stock
check is ``SELECT 1``, one round trip per request (issue 39: one of the 15 a conversation message cost).
Here an idle connection is usable when psycopg does not know it to be closed or broken and its socket has nothing
to read: a server that closed the connection (restart, ``pg_terminate_backend``, an idle timeout) leaves it
readable (its last message, then end of file). Anything readable, or a connection not idle, is checked the stock
way, so a doubt costs the old round trip and never a failed request.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus

from controlplane.fds import readable_now

__all__ = ["DatabaseWrapper"]


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if conn.info.transaction_status != TransactionStatus.IDLE:
            return bool(super().is_usable())
        try:
            readable = readable_now(conn.fileno(), select.POLLIN | select.POLLPRI)
        except (OSError, ValueError):
            return False
        if readable:  # the server said something unasked (probably goodbye): ask it the stock way
            return bool(super().is_usable())
        return True
