"""Chunks a step streams while it produces a reply (`ctx.stream`), handed to the instance API's SSE readers.

In memory only, on purpose: a chunk is a preview, not a fact. What a conversation keeps is the reply the step
appends to the thread (`ctx.reply`); a step re-run after a crash streams again under a new attempt id, and a
reader restarts its partial text when the attempt changes. Each task keeps only its latest attempt's chunks,
and a task's buffer is dropped once nobody can still want it (bounded by MAX_TASKS).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["Chunk", "StreamHub"]

MAX_TASKS = 256
MAX_CHUNKS = 4096


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    attempt: str


@dataclass
class _Buffer:
    attempt: str
    chunks: list[Chunk] = field(default_factory=list)


class StreamHub:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buffers: OrderedDict[str, _Buffer] = OrderedDict()

    def begin(self, task_id: str) -> str:
        """A new attempt at producing the task's reply: earlier chunks are void."""
        attempt = uuid.uuid4().hex[:12]
        with self._cond:
            self._buffers[task_id] = _Buffer(attempt)
            self._buffers.move_to_end(task_id)
            while len(self._buffers) > MAX_TASKS:
                self._buffers.popitem(last=False)
            self._cond.notify_all()
        return attempt

    def publish(self, task_id: str, text: str, attempt: str) -> None:
        with self._cond:
            buf = self._buffers.get(task_id)
            if buf is None or buf.attempt != attempt or len(buf.chunks) >= MAX_CHUNKS:
                return
            buf.chunks.append(Chunk(len(buf.chunks), text, attempt))
            self._cond.notify_all()

    def read(self, task_id: str, attempt: str | None, after: int, timeout_s: float) -> tuple[str | None, list[Chunk]]:
        """Chunks of the task's current attempt past `after` (all of them when the attempt changed), waiting up
        to `timeout_s` for one. Returns (current attempt, chunks)."""
        with self._cond:
            def ready() -> bool:
                buf = self._buffers.get(task_id)
                return buf is not None and (buf.attempt != attempt or len(buf.chunks) > after + 1)

            self._cond.wait_for(ready, timeout=timeout_s)
            buf = self._buffers.get(task_id)
            if buf is None:
                return attempt, []
            if buf.attempt != attempt:
                return buf.attempt, list(buf.chunks)
            return attempt, buf.chunks[after + 1:]

    def wake(self) -> None:
        """Let waiting readers look at the database again (a reply was committed, a task changed)."""
        with self._cond:
            self._cond.notify_all()
