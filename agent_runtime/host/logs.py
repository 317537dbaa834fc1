"""Structured JSON logs on stderr. Fields whose names suggest secrets are redacted, as a second line of
defence: the runtime never passes credential values to a logger in the first place."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

_STD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}
_SECRET_HINTS = ("token", "secret", "password", "api_key", "credential_value", "authorization")


def secret_key(key: str) -> bool:
    """Whether a field named `key` suggests a secret (its value is then never written out)."""
    return any(h in key.lower() for h in _SECRET_HINTS)


def redact(value: Any, depth: int = 0) -> Any:
    """`value` with every mapping entry whose key suggests a secret replaced by "[redacted]", at any depth: for
    what leaves the step's hands as data (log fields, a span's inputs and outputs)."""
    if depth > 20:
        return "[too deep]"
    if isinstance(value, dict):
        return {k: "[redacted]" if isinstance(k, str) and secret_key(k) else redact(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value]
    return value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(time.time(), 3), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        for key, value in vars(record).items():
            if key in _STD or key.startswith("_"):
                continue
            out[key] = "[redacted]" if secret_key(key) else value
        if record.exc_info and record.exc_info[0] is not None:
            out["exc"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(out, default=str)


RING_SIZE = 2000
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_TAIL_BLOCK = 64 * 1024


class RingHandler(logging.Handler):
    """The last RING_SIZE formatted records in memory: GET /v1/logs when the host has no log file."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=RING_SIZE)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a log line must never break the host
            self.handleError(record)


RING = RingHandler()


def setup_json_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    RING.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler, RING]
    root.setLevel(level)


def _file_tail(path: Path, n: int) -> list[str]:
    """The last `n` lines of `path`, reading backwards in blocks (a log file can be large)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        pos, data = fh.tell(), b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    return [ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()][-n:]


def log_tail(path: Path | None, limit: int, min_level: str | None = None) -> list[dict[str, Any]]:
    """The last `limit` records (oldest first) at or above `min_level`: from the file, else the ring."""
    floor = LEVELS.get((min_level or "").lower(), 0)
    try:
        lines = _file_tail(path, limit * 4 if floor else limit) if path is not None else list(RING.lines)
    except FileNotFoundError:
        lines = list(RING.lines)
    records: list[dict[str, Any]] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            rec = {"msg": line[:2000]}
        if floor and LEVELS.get(str(rec.get("level", "")).lower(), 0) < floor:
            continue
        records.append(rec)
    return records[-limit:]
