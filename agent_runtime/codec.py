"""Canonical JSON, digests and token estimates shared by the stores (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def digest_of(*parts: Any) -> str:
    """Checksum of a row's meaningful fields, in order."""
    return sha256_hex(canonical_json(list(parts)))


def estimate_tokens(text: str) -> int:
    """Cheap, model-free estimate (~4 characters per token), never below 1."""
    return max(1, (len(text) + 3) // 4)
