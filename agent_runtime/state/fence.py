"""The fenced single writer: a lease row with a generation, checked by the database in every write.

A session-level advisory lock only says who started first; it cannot stop a host that lost it (its lock
session was killed, a partition, a paused VM) from writing beside its successor, and it does not survive a
transaction-pooling proxy. So the host also takes the lease (`host_lease`: holder, generation, expiry) and
names itself in `application_name` ('agent-host:<holder>'). A statement-level trigger on every runtime
table refuses any write from a connection that calls itself a host but is not the lease's holder (SQLSTATE
AR001), and takes a share lock on the lease row for the rest of the transaction, so a takeover waits for
in-flight commits of the old holder and every later one fails. Writers that are not hosts (the `submit`
CLI, the control plane, a restore) are not fenced.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

__all__ = ["FENCE_SQLSTATE", "ensure_fences", "is_fence_error", "lease_acquire", "lease_release", "lease_renew",
           "lease_renew_holding_lock"]

FENCE_SQLSTATE = "AR001"
HOST_PREFIX = "agent-host:"

# Tables never fenced: the lease itself (the takeover writes it) and the migration bookkeeping.
_UNFENCED = ("host_lease", "agent_schema_version")


def is_fence_error(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) == FENCE_SQLSTATE


def ensure_fences(conn: psycopg.Connection, schema: str) -> int:
    """Install the fence trigger on every table of `schema` that lacks it (one catalog query when none do)."""
    missing = [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname <> ALL(%s) AND NOT EXISTS"
        " (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'agent_fence')",
        (schema, list(_UNFENCED))).fetchall()]
    for table in missing:
        conn.execute(sql.SQL(
            "CREATE OR REPLACE TRIGGER agent_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {}.{}"
            " FOR EACH STATEMENT EXECUTE FUNCTION {}.agent_fence()").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(schema)))
    return len(missing)


def lease_acquire(conn: psycopg.Connection, holder: str, ttl_s: float, *, steal: bool) -> int | None:
    """Take the lease; return its new generation, or None while another holder's lease is unexpired.

    `steal`: the caller holds the session advisory lock, so any previous holder's session is gone and its
    writes are fenced from the moment this commits.
    """
    row = conn.execute(
        "INSERT INTO host_lease (generation, holder, expires_at)"
        " VALUES (1, %s, clock_timestamp() + make_interval(secs => %s))"
        " ON CONFLICT (id) DO UPDATE SET generation = host_lease.generation + 1, holder = EXCLUDED.holder,"
        " expires_at = EXCLUDED.expires_at WHERE %s OR host_lease.expires_at < clock_timestamp()"
        " RETURNING generation", (holder, ttl_s, steal)).fetchone()
    return int(row[0]) if row else None


def lease_renew(conn: psycopg.Connection, holder: str, ttl_s: float) -> bool:
    """Extend the lease; False when this holder no longer has it (taken over)."""
    cur = conn.execute("UPDATE host_lease SET expires_at = clock_timestamp() + make_interval(secs => %s)"
                       " WHERE holder = %s", (ttl_s, holder))
    return cur.rowcount == 1


def lease_renew_holding_lock(conn: psycopg.Connection, holder: str, ttl_s: float, *,
                             check_lock: bool = True) -> bool | None:
    """Extend the lease and say whether this session still holds its advisory lock, in one round trip (every
    heartbeat interval, on every idle host: the second statement it replaces was a third of an idle host's
    queries). None: the lease is no longer this holder's (taken over); False: renewed, but the lock is gone.

    ``check_lock=False`` renews only (True when renewed): reading ``pg_locks`` copies the whole server's lock table
    under all its partition locks, work that grows with every session on the server, so with a thousand idle
    hosts a check on every renewal costs each of them in proportion to all the others. The caller checks at a
    slower pace; a live session loses its lock only if something unlocks it, and the fence refuses a deposed
    writer's writes meanwhile."""
    if not check_lock:
        return True if lease_renew(conn, holder, ttl_s) else None
    row = conn.execute(
        "UPDATE host_lease SET expires_at = clock_timestamp() + make_interval(secs => %s) WHERE holder = %s"
        " RETURNING EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND pid = pg_backend_pid())", (ttl_s, holder)).fetchone()
    return None if row is None else bool(row[0])


def lease_release(conn: psycopg.Connection, holder: str) -> bool:
    """End this holder's lease now (a clean stop): the next host takes over at once instead of after the TTL.

    Only the expiry moves; holder and generation stay, so the fence still admits this holder's writes until a
    successor takes the lease (and refuses them from then on, as after any takeover). False if it was not ours.
    """
    cur = conn.execute("UPDATE host_lease SET expires_at = clock_timestamp() WHERE holder = %s", (holder,))
    return cur.rowcount == 1
