"""Checksums of the rows that have no other integrity check, shared by the stores that write them and the
migration that backfills them (pure functions, no I/O).

Like the message and checkpoint checksums, they catch a truncated, corrupted or hand-edited row before its
content is acted on; they are not a signature against someone who can rewrite the database at will.
"""

from __future__ import annotations

from typing import Any

from agent_runtime.codec import digest_of

__all__ = ["effect_checksum", "fact_checksum", "judgment_checksum", "summary_checksum"]


def summary_checksum(thread: str, upto_seq: int, content: str) -> str:
    return digest_of("summary", thread, int(upto_seq), content)


def fact_checksum(key: str, value: Any, deleted: bool) -> str:
    return digest_of("fact", key, value, bool(deleted))


def judgment_checksum(task_id: Any, name: str, artifact: str, artifact_digest: str, passed: bool,
                      detail: Any) -> str:
    return digest_of("judgment", str(task_id) if task_id is not None else None, name, artifact, artifact_digest,
                     bool(passed), detail)


def effect_checksum(idem_key: str, task_id: Any, step: str, effect: str, args_digest: str, state: str,
                    result: Any, resolution: str | None, ordinal: int | None, explicit_key: str | None) -> str:
    return digest_of("effect", idem_key, str(task_id), step, effect, args_digest, state, result, resolution,
                     ordinal, explicit_key)
