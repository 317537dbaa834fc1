"""Leader leases: one holder of a named singleton (beat, the instance watchers) across every machine, fenced.

A lease is one PostgreSQL row (``Lease``: name, holder, epoch, expires_at). Taking and renewing it is one atomic
statement that succeeds only while the row is free (expired by the *database's* clock) or already ours; every
change of holder increments ``epoch``, the fencing token a leader passes along with what it sends. A holder acts
only while its own clock says the lease it last renewed is still valid (``lease.py``). Users:

- ``beat.LeaderScheduler``: several ``celery beat`` processes, only the leader sends (deploy: 2 beat replicas);
- ``loop.leader_loop``: any long-running loop (the pod watcher) runs on the leader only, stopped when deposed.

Unlike ``controlplane.locks.AdvisoryLock`` (a session lock: right for "one at a time" inside one job) a lease
survives no connection but needs none: it works through PgBouncer's transaction pooling, and a holder cut off
from the database knows when to stop (its lease period) without hearing from anyone.
"""
