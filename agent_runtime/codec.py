"""Canonical JSON, digests, token estimates and the storability check shared by the stores (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import json
import math
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


def unstorable(value: Any) -> str | None:
    """Why `value` cannot be stored as jsonb, or None when it can.

    Strict JSON (no NaN or infinities, only dicts, lists, strings, numbers, booleans and null), strings that
    encode as UTF-8 (no lone surrogates) and contain no NUL (PostgreSQL text cannot hold one). The answer names
    the type and the position (`$.a[2]`), never the data itself: it goes into logs and task details.
    """
    try:
        problem = _unstorable_at(value, "$", set())
        if problem is None:
            json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
    except RecursionError:
        return "nested too deeply to encode"
    except (TypeError, ValueError) as exc:  # whatever the walk did not foresee (e.g. an int too long to print)
        return f"not encodable as JSON ({type(exc).__name__})"
    return problem


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return f"a NUL character at offset {text.index(chr(0))}"
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"a lone surrogate at offset {exc.start}"
    return None


def _unstorable_at(value: Any, path: str, seen: set[int]) -> str | None:
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"a float {value!r} (not valid JSON) at {path}"
    if isinstance(value, str):
        problem = _text_problem(value)
        return f"a string with {problem} at {path}" if problem else None
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return f"a circular reference at {path}"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                for i, (key, item) in enumerate(value.items()):
                    if not isinstance(key, (str, int, float, bool)) and key is not None:
                        return f"a key of type {type(key).__name__} at {path} (key #{i})"
                    if isinstance(key, str) and (problem := _text_problem(key)):
                        return f"a key with {problem} at {path} (key #{i})"
                    where = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[key #{i}]"
                    if (problem := _unstorable_at(item, where, seen)) is not None:
                        return problem
                return None
            for i, item in enumerate(value):
                if (problem := _unstorable_at(item, f"{path}[{i}]", seen)) is not None:
                    return problem
            return None
        finally:
            seen.discard(id(value))
    return f"an object of type {type(value).__name__} at {path}"
