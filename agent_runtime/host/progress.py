"""The progress marker shared by the worker, /healthz and heartbeats (thread-safe, in memory only)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressView:
    task: str | None
    step: str | None
    checkpoint: int | None
    progress_seq: int
    busy: bool
    seconds_since_advance: float
    status: str
    step_timeout_s: float | None = None


class ProgressMarker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: str | None = None
        self._step: str | None = None
        self._checkpoint: int | None = None
        self._seq = 0
        self._busy = False
        self._last = time.monotonic()
        self._status = "booting"
        self._step_timeout_s: float | None = None

    def set_status(self, status: str) -> None:
        with self._lock:
            self._status = status

    def begin_step(self, task: str, step: str, timeout_s: float | None = None) -> None:
        with self._lock:
            self._task, self._step, self._busy = task, step, True
            self._step_timeout_s = timeout_s
            self._seq += 1
            self._last = time.monotonic()
            self._status = "working"

    def advance(self, checkpoint: int | None = None) -> None:
        with self._lock:
            self._seq += 1
            self._last = time.monotonic()
            if checkpoint is not None:
                self._checkpoint = checkpoint

    def end_step(self, checkpoint: int | None) -> None:
        with self._lock:
            self._seq += 1
            self._busy = False
            self._last = time.monotonic()
            if checkpoint is not None:
                self._checkpoint = checkpoint

    def idle(self) -> None:
        with self._lock:
            self._busy = False
            self._last = time.monotonic()
            self._status = "idle"

    def view(self) -> ProgressView:
        with self._lock:
            return ProgressView(self._task, self._step, self._checkpoint, self._seq, self._busy,
                                time.monotonic() - self._last, self._status, self._step_timeout_s)
