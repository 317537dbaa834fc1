"""Model usage: the token counts an agent reports for each model call, kept in the tenant's schema to bill from.

The runtime cannot see inside an agent's model client, so the agent reports what the provider answered
(`ctx.usage(model=..., input_tokens=..., output_tokens=...)`). A report is written at once (the host's
connection autocommits), so a crash after the call cannot lose it; a step run again after a crash that calls the
model again pays again and reports again, which is the truth. A report names its call with `key` when the
provider gives one (a chat completion's `id`): the same call reported twice (a cached answer replayed with its
usage) then counts once. The control plane reads the table through `provisioning/resources/runtime_tables.py`.
"""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg

__all__ = ["usage_record"]

_MAX_MODEL_CHARS = 200
_MAX_KEY_CHARS = 500


def usage_record(conn: psycopg.Connection, *, task_id: UUID | None, step: str, model: str, input_tokens: int,
                 output_tokens: int, key: str | None = None) -> bool:
    """Record one model call's tokens; False when a report under the same ``key`` already counted."""
    if not isinstance(model, str) or not model.strip() or len(model) > _MAX_MODEL_CHARS:
        raise ValueError(f"usage needs the model's name (1-{_MAX_MODEL_CHARS} characters), not {model!r}")
    for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number of tokens, 0 or more, not {value!r}")
    if key is not None and (not isinstance(key, str) or not key or len(key) > _MAX_KEY_CHARS):
        raise ValueError(f"a usage key is a non-empty string of at most {_MAX_KEY_CHARS} characters")
    usage_key = f"call:{key}" if key is not None else f"report:{uuid.uuid4()}"
    cur = conn.execute(
        "INSERT INTO model_usage (task_id, step, model, input_tokens, output_tokens, usage_key)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (usage_key) DO NOTHING",
        (task_id, step, model.strip(), input_tokens, output_tokens, usage_key))
    return cur.rowcount == 1
