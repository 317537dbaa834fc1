"""Tool output cache: `cached(tool, args, call)` returns a recorded result instead of paying again.

Results up to `inline_max` bytes live inline in Postgres; larger ones are content-addressed in the
object store (`cas/<sha256>`), encrypted by the EncryptedObjectStore wrapper. Each tool has a TTL.
Values are JSON. An output fetched under a credential records the credential's (name, version), its
*authority*: it is served only to a caller holding that same version, so after a revocation (or a new
version) it is fetched again, never replayed from a grant that no longer holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from agent_runtime.codec import canonical_json, sha256_hex
from agent_runtime.errors import CorruptState, SnapshotMissing
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["ToolCache"]


class ToolCache:
    def __init__(self, conn: psycopg.Connection, store: ObjectStore, *, inline_max: int = 8192,
                 ttl_s: Mapping[str, float | None] | None = None, default_ttl_s: float | None = 86400.0) -> None:
        self.conn = conn
        self.store = store
        self.inline_max = inline_max
        self.ttl_s = dict(ttl_s or {})
        self.default_ttl_s = default_ttl_s
        self.hits = 0
        self.misses = 0

    @staticmethod
    def args_hash(args: Any) -> str:
        return sha256_hex(canonical_json(args))

    def lookup(self, tool: str, args: Any, authority: tuple[str, int] | None = None) -> tuple[bool, Any]:
        row = self.conn.execute(
            "SELECT inline_value, object_key, content_hash, credential, credential_version FROM tool_cache"
            " WHERE tool = %s AND args_hash = %s AND (expires_at IS NULL OR expires_at > clock_timestamp())",
            (tool, self.args_hash(args)),
        ).fetchone()
        if row is None:
            return False, None
        inline, key, content_hash, credential, credential_version = row
        recorded = (credential, credential_version) if credential is not None else None
        if recorded != authority:
            return False, None  # fetched under another grant (or none): not this caller's to replay
        try:
            data = bytes(inline) if inline is not None else self.store.get(key)
        except SnapshotMissing:
            return False, None  # the large copy is gone: pay again rather than fail
        if sha256_hex(data) != content_hash:
            raise CorruptState(f"cached output of {tool} failed its content hash")
        return True, json.loads(data)

    def store_result(self, tool: str, args: Any, value: Any, authority: tuple[str, int] | None = None) -> None:
        data = canonical_json(value).encode()
        content_hash = sha256_hex(data)
        inline: bytes | None = data
        key: str | None = None
        if len(data) > self.inline_max:
            key = f"cas/{content_hash[:2]}/{content_hash}"
            if not self.store.exists(key):
                self.store.put(key, data)
            inline = None
        ttl = self.ttl_s.get(tool, self.default_ttl_s)
        self.conn.execute(
            "INSERT INTO tool_cache (tool, args_hash, inline_value, object_key, size, content_hash, expires_at,"
            " credential, credential_version) VALUES (%s, %s, %s, %s, %s, %s,"
            " CASE WHEN %s::float8 IS NULL THEN NULL ELSE clock_timestamp() + make_interval(secs => %s) END, %s, %s)"
            " ON CONFLICT (tool, args_hash) DO UPDATE SET inline_value = EXCLUDED.inline_value,"
            " object_key = EXCLUDED.object_key, size = EXCLUDED.size, content_hash = EXCLUDED.content_hash,"
            " created_at = clock_timestamp(), expires_at = EXCLUDED.expires_at, credential = EXCLUDED.credential,"
            " credential_version = EXCLUDED.credential_version",
            (tool, self.args_hash(args), inline, key, len(data), content_hash, ttl, ttl,
             authority[0] if authority else None, authority[1] if authority else None),
        )

    def cached(self, tool: str, args: Any, call: Callable[[], Any], authority: tuple[str, int] | None = None) -> Any:
        hit, value = self.lookup(tool, args, authority)
        if hit:
            self.hits += 1
            return value
        self.misses += 1
        value = call()
        self.store_result(tool, args, value, authority)
        return value
