"""Thread policies: what a new message does to the thread's run that is still going (docs/conversations.md).

A thread's *run* is the task a message started (params `thread` and `message_id`); it is *going* while it is
`pending` or `running` (a blocked run waits for a human and holds nothing up). `admit()` applies the message's
policy inside the transaction that stores the message and its task, under a per-thread advisory lock, so two
messages of one thread are decided one after the other and a re-delivered message (its task exists) changes
nothing:

- `enqueue`: nothing; the new run starts after the going one (one worker, submission order).
- `reject`: `ThreadBusy` naming the going run; the caller stores nothing.
- `interrupt`: the going runs end `interrupted`; the worker stops each at its next step boundary, and whatever
  it committed (steps, effects, a reply) stays.
- `rollback`: the going runs end `rolled_back` and the thread's window skips their messages, as if they had
  not started; but an effect is a fact of the world, so a run with an effect that happened or may have
  (committed, in doubt, waiting for a human) is not rolled back: `RollbackRefused` names the effect. This is
  what `restore_checkpoint()` does with a checkpoint behind a committed effect (refused unless the caller
  forks); a rollback that forgot a charge would let the next run charge again under a new key.

No HTTP here (`host.api` maps the errors); no commit either (the caller's transaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

__all__ = ["GOING", "HALTED", "POLICIES", "RollbackRefused", "ThreadBusy", "admit", "going"]

POLICIES = ("reject", "enqueue", "interrupt", "rollback")
GOING = ("pending", "running")
# What interrupt and rollback end a run as; like 'cancelled', no write of the worker's replaces them.
HALTED = {"interrupt": "interrupted", "rollback": "rolled_back"}


@dataclass(frozen=True)
class GoingRun:
    task_id: UUID
    status: str


class ThreadBusy(Exception):
    """`reject`: the thread has a run going."""

    def __init__(self, run: GoingRun) -> None:
        super().__init__(f"task {run.task_id} of this thread is still {run.status}")
        self.run = run


class RollbackRefused(Exception):
    """`rollback` past an effect that happened (or may have): it would be undone in the thread's memory only."""

    def __init__(self, task_id: UUID, effect: str, idem_key: str, state: str) -> None:
        super().__init__(f"task {task_id} has effect {effect!r} ({idem_key}, {state}): a rollback would forget it "
                         "while the world keeps it; send the message with 'interrupt' or 'enqueue'")
        self.task_id, self.effect, self.idem_key, self.state = task_id, effect, idem_key, state


def going(conn: psycopg.Connection, thread: str, *, exclude: UUID | None = None,
          lock: bool = False) -> list[GoingRun]:
    """The thread's runs still going, the running one first. `lock`: row-locked until the transaction ends (the
    effect ledger's new intents wait for it, see `EffectLedger._insert`)."""
    query = ("SELECT id, status FROM tasks WHERE status IN ('pending', 'running') AND params ? 'message_id'"
             " AND params->>'thread' = %s AND id IS DISTINCT FROM %s"
             " ORDER BY (status = 'running') DESC, created_at, id")
    rows = conn.execute(query + " FOR UPDATE" if lock else query, (thread, exclude)).fetchall()
    return [GoingRun(r[0], r[1]) for r in rows]


def admit(conn: psycopg.Connection, thread: str, message_id: UUID, policy: str) -> list[GoingRun]:
    """Apply `policy` for the new message `message_id` of `thread`; return the runs it ended (with their new
    status). Inside the caller's transaction, before the message's task is inserted."""
    if policy not in POLICIES:
        raise ValueError(f"unknown thread policy {policy!r}")
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_runtime.thread:' || %s))", (thread,))
    if policy == "enqueue":
        return []
    if conn.execute("SELECT 1 FROM tasks WHERE id = %s", (message_id,)).fetchone() is not None:
        return []  # a re-delivery: the policy was applied when the message first arrived
    runs = going(conn, thread, exclude=message_id, lock=True)
    if not runs:
        return []
    if policy == "reject":
        raise ThreadBusy(runs[0])
    ids = [r.task_id for r in runs]
    if policy == "rollback":
        # 'intent' resolved 'unreached' certainly never reached the provider; anything else may have happened.
        hit = conn.execute(
            "SELECT task_id, effect, idem_key, state FROM effects WHERE task_id = ANY(%s) AND state <> 'failed'"
            " AND NOT (state = 'intent' AND resolution IS NOT DISTINCT FROM 'unreached') ORDER BY id LIMIT 1",
            (ids,)).fetchone()
        if hit is not None:
            raise RollbackRefused(hit[0], hit[1], hit[2], hit[3])
    status = HALTED[policy]
    conn.execute("UPDATE tasks SET status = %s, blocked_reason = NULL, blocked_detail = NULL,"
                 " blocked_credential = NULL, updated_at = clock_timestamp() WHERE id = ANY(%s)", (status, ids))
    return [GoingRun(i, status) for i in ids]
