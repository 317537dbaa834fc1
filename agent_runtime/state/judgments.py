"""Judgments bound to artifacts: a verification result stores the digest of what it checked.

A judgment is valid only while the artifact's current digest equals the recorded one, so a rollback of
the workspace can never re-attach a "scan passed" to files that were not scanned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.errors import CorruptState, JudgmentInvalid
from agent_runtime.state.rowchecks import judgment_checksum

__all__ = ["Judgment", "JudgmentStore"]


@dataclass(frozen=True)
class Judgment:
    id: int
    name: str
    artifact: str
    artifact_digest: str
    passed: bool
    detail: dict[str, Any]


class JudgmentStore:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def record(self, *, task_id: UUID | None, name: str, artifact: str, artifact_digest: str, passed: bool,
               detail: dict[str, Any] | None = None) -> Judgment:
        row = self.conn.execute(
            "INSERT INTO judgments (task_id, name, artifact, artifact_digest, passed, detail, checksum)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (task_id, name, artifact, artifact_digest, passed, Jsonb(detail or {}),
             judgment_checksum(task_id, name, artifact, artifact_digest, passed, detail or {})),
        ).fetchone()
        assert row is not None
        return Judgment(int(row[0]), name, artifact, artifact_digest, passed, detail or {})

    def current(self, name: str, artifact: str, current_digest: str) -> Judgment | None:
        """The latest judgment made on exactly this content, or None."""
        row = self.conn.execute(
            "SELECT id, passed, detail, task_id, checksum FROM judgments WHERE name = %s AND artifact = %s"
            " AND artifact_digest = %s ORDER BY id DESC LIMIT 1",
            (name, artifact, current_digest),
        ).fetchone()
        if row is None:
            return None
        if row[4] != judgment_checksum(row[3], name, artifact, current_digest, row[1], row[2]):
            raise CorruptState(f"judgment {name!r} on {artifact} (id {row[0]}) failed its checksum; a verdict "
                               "that may have been edited is never relied on")
        return Judgment(int(row[0]), name, artifact, current_digest, bool(row[1]), row[2])

    def require(self, name: str, artifact: str, current_digest: str) -> Judgment:
        """Raise JudgmentInvalid unless a passing judgment is bound to the artifact as it is now."""
        j = self.current(name, artifact, current_digest)
        if j is None:
            latest = self.conn.execute(
                "SELECT artifact_digest, passed FROM judgments WHERE name = %s AND artifact = %s"
                " ORDER BY id DESC LIMIT 1", (name, artifact),
            ).fetchone()
            hint = (f"; the latest {name!r} judgment checked digest {latest[0][:12]}, the artifact is now "
                    f"{current_digest[:12]}") if latest else ""
            raise JudgmentInvalid(f"no {name!r} judgment bound to {artifact} at its current content{hint}")
        if not j.passed:
            raise JudgmentInvalid(f"{name!r} judgment on {artifact} at its current content did not pass")
        return j
