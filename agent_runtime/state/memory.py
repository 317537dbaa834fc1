"""Conversation memory: the append-only message log, KV facts with versions, and rollover summaries.

The working window is the latest summary plus the newest messages after it that fit the token budget;
it is read from the tail with bounded batches, so its cost does not grow with the length of the log.
Summaries are records of their own; the log is never rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.codec import digest_of, estimate_tokens
from agent_runtime.errors import CorruptState
from agent_runtime.state.rowchecks import fact_checksum, summary_checksum

__all__ = ["Fact", "Message", "Summary", "Window", "MemoryStore"]


@dataclass(frozen=True)
class Message:
    seq: int
    role: str
    content: str
    metadata: dict[str, Any]
    tokens: int


@dataclass(frozen=True)
class Summary:
    id: int
    upto_seq: int
    content: str
    tokens: int


@dataclass(frozen=True)
class Fact:
    key: str
    version: int
    value: Any


@dataclass(frozen=True)
class Window:
    summary: Summary | None
    messages: list[Message]
    tokens: int
    rows_scanned: int
    # True when messages after the summary did not all fit: time to roll over.
    needs_rollover: bool = False
    dropped_seqs: tuple[int, int] | None = field(default=None)


def _message_checksum(thread: str, role: str, content: str, metadata: dict[str, Any]) -> str:
    return digest_of(thread, role, content, metadata)


class MemoryStore:
    def __init__(self, conn: psycopg.Connection, thread: str = "main") -> None:
        self.conn = conn
        self.thread = thread

    def in_thread(self, thread: str) -> MemoryStore:
        """The same store, scoped to another conversation thread (facts are shared by all threads)."""
        return MemoryStore(self.conn, thread)

    # --- message log -------------------------------------------------------------------------
    def append(self, role: str, content: str, metadata: dict[str, Any] | None = None) -> int:
        """Append one message (in the caller's transaction); return its sequence number."""
        return self.append_many([(role, content, metadata or {})])[-1]

    def append_many(self, items: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int]:
        seqs: list[int] = []
        with self.conn.cursor() as cur:
            for role, content, metadata in items:
                cur.execute(
                    "INSERT INTO messages (thread, role, content, metadata, tokens, checksum)"
                    " VALUES (%s, %s, %s, %s, %s, %s) RETURNING seq",
                    (
                        self.thread,
                        role,
                        content,
                        Jsonb(metadata),
                        estimate_tokens(content),
                        _message_checksum(self.thread, role, content, metadata),
                    ),
                )
                row = cur.fetchone()
                assert row is not None
                seqs.append(int(row[0]))
        return seqs

    def _rows(self, query: str, params: Sequence[Any]) -> list[Message]:
        out: list[Message] = []
        for seq, role, content, metadata, tokens, checksum in self.conn.execute(query, params).fetchall():
            if checksum != _message_checksum(self.thread, role, content, metadata):
                raise CorruptState(f"message seq={seq} failed its checksum (truncated or edited row)")
            out.append(Message(int(seq), role, content, metadata, int(tokens)))
        return out

    _COLS = "seq, role, content, metadata, tokens, checksum"
    # A run a new message rolled back (`state.threads`) never happened for the thread: its question and whatever it
    # appended are left out of the window, the tail and the summaries. The log itself keeps them (append-only).
    _LIVE = (" AND NOT (metadata ? 'task' AND metadata->>'task' IN"
             " (SELECT id::text FROM tasks WHERE status = 'rolled_back'))")

    def tail(self, n: int) -> list[Message]:
        rows = self._rows(
            f"SELECT {self._COLS} FROM messages WHERE thread = %s{self._LIVE} ORDER BY seq DESC LIMIT %s",  # noqa: S608
            (self.thread, n),
        )
        return list(reversed(rows))

    def since(self, seq: int, limit: int = 1000) -> list[Message]:
        return self._rows(
            f"SELECT {self._COLS} FROM messages WHERE thread = %s AND seq > %s ORDER BY seq LIMIT %s",  # noqa: S608
            (self.thread, seq, limit),
        )

    def range(self, first: int, last: int) -> list[Message]:
        return self._rows(
            f"SELECT {self._COLS} FROM messages WHERE thread = %s AND seq BETWEEN %s AND %s ORDER BY seq",  # noqa: S608
            (self.thread, first, last),
        )

    def last_seq(self) -> int:
        row = self.conn.execute(
            "SELECT seq FROM messages WHERE thread = %s ORDER BY seq DESC LIMIT 1", (self.thread,)
        ).fetchone()
        return int(row[0]) if row else 0

    # --- summaries and the working window ----------------------------------------------------
    def add_summary(self, upto_seq: int, content: str) -> int:
        row = self.conn.execute(
            "INSERT INTO summaries (thread, upto_seq, content, tokens, checksum) VALUES (%s, %s, %s, %s, %s)"
            " RETURNING id",
            (self.thread, upto_seq, content, estimate_tokens(content),
             summary_checksum(self.thread, upto_seq, content)),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def latest_summary(self) -> Summary | None:
        row = self.conn.execute(
            "SELECT id, upto_seq, content, tokens, checksum FROM summaries WHERE thread = %s"
            " ORDER BY upto_seq DESC, id DESC LIMIT 1",
            (self.thread,),
        ).fetchone()
        if row is None:
            return None
        if row[4] != summary_checksum(self.thread, row[1], row[2]):
            raise CorruptState(f"summary id={row[0]} of thread {self.thread!r} failed its checksum")
        return Summary(int(row[0]), int(row[1]), row[2], int(row[3]))

    def window(self, token_budget: int, batch: int = 64) -> Window:
        """Latest summary + newest messages after it within `token_budget` (read from the tail).

        The window never exceeds the budget: a summary larger than half of it is shown cut to that half.
        """
        summary = self.latest_summary()
        if summary is not None and summary.tokens > token_budget // 2:
            cut = summary.content[: max(0, token_budget // 2) * 4 - 3]
            summary = Summary(summary.id, summary.upto_seq, cut, estimate_tokens(cut))
        floor = summary.upto_seq if summary else 0
        budget = token_budget - (summary.tokens if summary else 0)
        picked: list[Message] = []
        scanned = 0
        used = 0
        cursor_seq: int | None = None
        full = False
        while not full:
            upper = cursor_seq if cursor_seq is not None else 2**62
            rows = self._rows(
                f"SELECT {self._COLS} FROM messages WHERE thread = %s AND seq > %s AND seq < %s{self._LIVE}"  # noqa: S608
                " ORDER BY seq DESC LIMIT %s",
                (self.thread, floor, upper, batch),
            )
            scanned += len(rows)
            for msg in rows:
                if used + msg.tokens > budget:
                    full = True
                    break
                picked.append(msg)
                used += msg.tokens
            if len(rows) < batch:
                break
            cursor_seq = rows[-1].seq
        picked.reverse()
        dropped = None
        if full:
            first_kept = picked[0].seq if picked else self.last_seq() + 1
            dropped = (floor + 1, first_kept - 1)
        return Window(
            summary=summary,
            messages=picked,
            tokens=used + (summary.tokens if summary else 0),
            rows_scanned=scanned,
            needs_rollover=full,
            dropped_seqs=dropped,
        )

    _FOLD_BATCH = 500  # messages handed to the summarizer at once

    def rollover(self, token_budget: int, summarize: Callable[[Summary | None, list[Message]], str]) -> Summary | None:
        """When the window overflows, fold older messages into a new summary record.

        The cut keeps the newest half of the budget as raw messages, leaving room for the summary and
        for the turns that follow, so rollovers do not happen on every turn.
        """
        if not self.window(token_budget).needs_rollover:
            return None
        win = self.window(token_budget // 2)
        if win.dropped_seqs is None:
            return None
        first, last = win.dropped_seqs
        # Summarize in bounded batches of this thread's own rows (keyset on (thread, seq)), from the
        # previous summary; the log itself stays untouched. The sequence is global: a range of seqs says
        # nothing about how many of them are this thread's, so the walk never steps through seq ranges.
        text = win.summary.content if win.summary else ""
        prev = win.summary
        after = first - 1
        rolled_back = {r[0] for r in self.conn.execute("SELECT id::text FROM tasks WHERE status = 'rolled_back'")}
        while True:
            chunk = self._rows(
                f"SELECT {self._COLS} FROM messages WHERE thread = %s AND seq > %s AND seq <= %s"  # noqa: S608
                " ORDER BY seq LIMIT %s",
                (self.thread, after, last, self._FOLD_BATCH),
            )
            if not chunk:
                break
            # Filtered here, not in the query: a batch of nothing but rolled-back rows must not end the walk.
            live = [m for m in chunk if str(m.metadata.get("task")) not in rolled_back]
            if live:
                text = summarize(prev, live)
                prev = Summary(0, live[-1].seq, text, estimate_tokens(text))
            if len(chunk) < self._FOLD_BATCH:
                break
            after = chunk[-1].seq
        # A summary is itself budgeted: at most a quarter of the window, so the newest turns keep their room.
        text = text[: max(1, token_budget // 4) * 4]
        sid = self.add_summary(last, text)
        return Summary(sid, last, text, estimate_tokens(text))

    # --- KV facts ---------------------------------------------------------------------------
    def set_fact(self, key: str, value: Any) -> int:
        row = self.conn.execute(
            "INSERT INTO facts (key, version, value, checksum)"
            " SELECT %s, coalesce(max(version), 0) + 1, %s, %s FROM facts WHERE key = %s RETURNING version",
            (key, Jsonb(value), fact_checksum(key, value, False), key),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def delete_fact(self, key: str) -> int:
        row = self.conn.execute(
            "INSERT INTO facts (key, version, value, deleted, checksum)"
            " SELECT %s, coalesce(max(version), 0) + 1, NULL, true, %s FROM facts WHERE key = %s RETURNING version",
            (key, fact_checksum(key, None, True), key),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def get_fact(self, key: str) -> Fact | None:
        row = self.conn.execute(
            "SELECT version, value, deleted, checksum FROM facts WHERE key = %s ORDER BY version DESC LIMIT 1", (key,)
        ).fetchone()
        if row is not None and row[3] != fact_checksum(key, row[1], row[2]):
            raise CorruptState(f"fact {key!r} version {row[0]} failed its checksum")
        if row is None or row[2]:
            return None
        return Fact(key, int(row[0]), row[1])

    def fact_history(self, key: str) -> list[Fact]:
        rows = self.conn.execute(
            "SELECT version, value, deleted, checksum FROM facts WHERE key = %s ORDER BY version", (key,)
        ).fetchall()
        for version, value, deleted, checksum in rows:
            if checksum != fact_checksum(key, value, deleted):
                raise CorruptState(f"fact {key!r} version {version} failed its checksum")
        return [Fact(key, int(v), val) for v, val, _d, _c in rows]
