"""Task checkpoints: the case file (steps done, waiting on, ruled out, notes) plus what it depends on.

A checkpoint row is small and fixed-size (step, workspace digest, effect-ledger position, checksum); the
case file is stored as per-step delta rows (`case_entries`), so a write is O(size of the step), never
O(history). Retention keeps the latest K checkpoints plus a thinning of older ones; case entries are the
case file itself and are kept. A fork copies the case file once and becomes the new base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.codec import digest_of
from agent_runtime.errors import CorruptState, SchemaTooNew
from agent_runtime.state.migrations import LATEST_VERSION

__all__ = ["CaseDelta", "CaseFile", "Checkpoint", "CheckpointStore"]

FORMAT_VERSION = LATEST_VERSION


@dataclass
class CaseDelta:
    """What one step adds to the case file."""

    done: dict[str, Any] = field(default_factory=dict)
    waiting: dict[str, Any] = field(default_factory=dict)  # value None clears a wait
    ruled_out: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def entries(self) -> list[tuple[str, str, Any]]:
        out: list[tuple[str, str, Any]] = []
        for kind, items in (("done", self.done), ("waiting", self.waiting),
                            ("ruled_out", self.ruled_out), ("note", self.notes)):
            out.extend((kind, k, v) for k, v in items.items())
        return out


@dataclass(frozen=True)
class CaseFile:
    steps_done: dict[str, Any]
    waiting_on: dict[str, Any]
    ruled_out: dict[str, Any]
    notes: dict[str, Any]

    @staticmethod
    def empty() -> CaseFile:
        return CaseFile({}, {}, {}, {})


@dataclass(frozen=True)
class Checkpoint:
    id: int
    task_id: UUID
    seq: int
    branch: int
    step: str
    kind: str
    format_version: int
    workspace_digest: str
    ledger_pos: int
    snapshot_key: str | None


def _cp_checksum(task_id: UUID, seq: int, branch: int, step: str, kind: str, fmt: int, wdigest: str,
                 ledger_pos: int, snapshot_key: str | None) -> str:
    return digest_of(str(task_id), seq, branch, step, kind, fmt, wdigest, ledger_pos, snapshot_key)


def _entry_checksum(task_id: UUID, seq: int, kind: str, key: str, value: Any) -> str:
    return digest_of(str(task_id), seq, kind, key, value)


# A checkpoint row as `CheckpointStore.decode` reads it (also read by `tasks.start_run`, with the task).
COLUMNS = "id, task_id, seq, branch, step, kind, format_version, workspace_digest, ledger_pos, snapshot_key, checksum"


class CheckpointStore:
    def __init__(self, conn: psycopg.Connection, keep_latest: int = 5, prune_every: int = 10) -> None:
        self.conn = conn
        self.keep_latest = keep_latest
        self.prune_every = prune_every

    def last_seq(self, task_id: UUID) -> int:
        row = self.conn.execute(
            "SELECT seq FROM checkpoints WHERE task_id = %s ORDER BY seq DESC LIMIT 1", (task_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def commit(self, task_id: UUID, step: str, delta: CaseDelta, *, workspace_digest: str, ledger_pos: int,
               kind: str = "step", branch: int = 0, snapshot_key: str | None = None,
               seq: int | None = None) -> Checkpoint:
        """Insert the delta rows and one checkpoint row, in one statement (so in the caller's transaction, if any)."""
        seq = (self.last_seq(task_id) + 1) if seq is None else seq
        return self.commit_together(task_id, step, delta, workspace_digest=workspace_digest, ledger_pos=ledger_pos,
                                    branch=branch, seq=seq, snapshot_key=snapshot_key, kind=kind)

    def commit_together(self, task_id: UUID, step: str, delta: CaseDelta, *, workspace_digest: str, ledger_pos: int,
                        branch: int, seq: int, snapshot_key: str | None = None, kind: str = "step",
                        writes: Sequence[tuple[str, Sequence[Any]]] = ()) -> Checkpoint:
        """`commit` as ONE statement together with the caller's `writes` (data-modifying statements without
        RETURNING, run as its CTEs): one round trip, and atomic on an autocommit connection without the BEGIN and
        COMMIT an explicit transaction costs. A step's checkpoint, its 'done' event and its task's progress go
        this way (`host.runner`). Pruning, when due, follows as a statement of its own: it only thins history."""
        entries = delta.entries()
        parts = [f"w{i} AS ({text})" for i, (text, _params) in enumerate(writes)]
        params: list[Any] = [p for _text, ps in writes for p in ps]
        if entries:
            parts.append(
                "ce AS (INSERT INTO case_entries (task_id, checkpoint_seq, kind, key, value, checksum)"
                " SELECT %s, %s, u.kind, u.key, u.value, u.checksum FROM unnest(%s::text[], %s::text[], %s::jsonb[],"
                " %s::text[]) AS u(kind, key, value, checksum))")
            params += [task_id, seq, [k for k, _key, _v in entries], [key for _k, key, _v in entries],
                       [Jsonb(v) for _k, _key, v in entries],
                       [_entry_checksum(task_id, seq, k, key, v) for k, key, v in entries]]
        ctes = "WITH " + ", ".join(parts) + " " if parts else ""  # the caller's own statements, never values
        row = self.conn.execute(
            ctes + "INSERT INTO checkpoints (task_id, seq, branch, step, kind, format_version, workspace_digest,"  # noqa: S608
            " ledger_pos, snapshot_key, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (*params, task_id, seq, branch, step, kind, FORMAT_VERSION, workspace_digest, ledger_pos, snapshot_key,
             _cp_checksum(task_id, seq, branch, step, kind, FORMAT_VERSION, workspace_digest, ledger_pos,
                          snapshot_key)),
        ).fetchone()
        assert row is not None
        if self.prune_every and seq % self.prune_every == 0:
            self.prune(task_id, seq)
        return Checkpoint(int(row[0]), task_id, seq, branch, step, kind, FORMAT_VERSION, workspace_digest,
                          ledger_pos, snapshot_key)

    def decode(self, row: tuple[Any, ...]) -> Checkpoint:
        """A checkpoint row of `COLUMNS`, checked: its checksum, and a format this runtime reads."""
        cid, task_id, seq, branch, step, kind, fmt, wdigest, lpos, skey, checksum = row
        if checksum != _cp_checksum(task_id, seq, branch, step, kind, fmt, wdigest, lpos, skey):
            raise CorruptState(f"checkpoint id={cid} (task {task_id}, seq {seq}) failed its checksum")
        if fmt > FORMAT_VERSION:
            raise SchemaTooNew(
                f"checkpoint id={cid} was written by format version {fmt}; this runtime reads up to "
                f"{FORMAT_VERSION}: refusing to resume from it"
            )
        return Checkpoint(int(cid), task_id, int(seq), int(branch), step, kind, int(fmt), wdigest, int(lpos), skey)

    def latest(self, task_id: UUID) -> Checkpoint | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM checkpoints WHERE task_id = %s ORDER BY seq DESC LIMIT 1",  # noqa: S608
            (task_id,),
        ).fetchone()
        return self.decode(row) if row else None

    def get(self, checkpoint_id: int) -> Checkpoint:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM checkpoints WHERE id = %s", (checkpoint_id,)  # noqa: S608
        ).fetchone()
        if row is None:
            raise CorruptState(f"checkpoint id={checkpoint_id} does not exist (pruned?)")
        return self.decode(row)

    def list(self, task_id: UUID) -> list[Checkpoint]:
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM checkpoints WHERE task_id = %s ORDER BY seq", (task_id,)  # noqa: S608
        ).fetchall()
        return [self.decode(r) for r in rows]

    def case_file(self, cp: Checkpoint | None) -> CaseFile:
        if cp is None:
            return CaseFile.empty()
        base_row = self.conn.execute(
            "SELECT coalesce(max(seq), 0) FROM checkpoints WHERE task_id = %s AND kind = 'fork' AND seq <= %s",
            (cp.task_id, cp.seq),
        ).fetchone()
        base = int(base_row[0]) if base_row else 0
        rows = self.conn.execute(
            "SELECT checkpoint_seq, kind, key, value, checksum FROM case_entries"
            " WHERE task_id = %s AND checkpoint_seq BETWEEN %s AND %s ORDER BY checkpoint_seq, id",
            (cp.task_id, base, cp.seq),
        ).fetchall()
        sections: dict[str, dict[str, Any]] = {"done": {}, "waiting": {}, "ruled_out": {}, "note": {}}
        for seq, kind, key, value, checksum in rows:
            if checksum != _entry_checksum(cp.task_id, seq, kind, key, value):
                raise CorruptState(f"case entry of task {cp.task_id} at checkpoint seq {seq} failed its checksum")
            if kind == "waiting" and value is None:
                sections["waiting"].pop(key, None)
            else:
                sections[kind][key] = value
        return CaseFile(sections["done"], sections["waiting"], sections["ruled_out"], sections["note"])

    def prune(self, task_id: UUID, newest_seq: int) -> int:
        """Keep the latest K, then one in 10 up to 100 back, then one in 100; never fork bases."""
        cutoff = newest_seq - self.keep_latest
        cur = self.conn.execute(
            "DELETE FROM checkpoints WHERE task_id = %s AND seq <= %s AND kind <> 'fork'"
            " AND NOT ((%s - seq < 100 AND seq %% 10 = 0) OR seq %% 100 = 0)",
            (task_id, cutoff, newest_seq),
        )
        return cur.rowcount

    def fork_from(self, cp: Checkpoint, *, new_branch: int, workspace_digest: str, ledger_pos: int,
                  reason: str) -> Checkpoint:
        """Start an explicit new branch from `cp`'s case file against the world as it is now."""
        case = self.case_file(cp)
        delta = CaseDelta(done=dict(case.steps_done), waiting=dict(case.waiting_on),
                          ruled_out=dict(case.ruled_out), notes={**case.notes, "__fork_reason__": reason})
        self.conn.execute(
            "INSERT INTO branches (task_id, branch, from_checkpoint, reason) VALUES (%s, %s, %s, %s)",
            (cp.task_id, new_branch, cp.id, reason),
        )
        self.conn.execute("UPDATE tasks SET branch = %s WHERE id = %s", (new_branch, cp.task_id))
        return self.commit(cp.task_id, cp.step, delta, workspace_digest=workspace_digest, ledger_pos=ledger_pos,
                           kind="fork", branch=new_branch)
