"""Structured JSON logs on stderr. Fields whose names suggest secrets are redacted, as a second line of
defence: the runtime never passes credential values to a logger in the first place."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}
_SECRET_HINTS = ("token", "secret", "password", "api_key", "credential_value", "authorization")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(time.time(), 3), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        for key, value in vars(record).items():
            if key in _STD or key.startswith("_"):
                continue
            out[key] = "[redacted]" if any(h in key.lower() for h in _SECRET_HINTS) else value
        if record.exc_info and record.exc_info[0] is not None:
            out["exc"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(out, default=str)


def setup_json_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
