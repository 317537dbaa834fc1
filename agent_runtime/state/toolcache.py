"""Tool output cache: `cached(tool, args, call)` returns a recorded result instead of paying again.

Results up to `inline_max` bytes live inline in Postgres; larger ones are content-addressed in the
object store (`cas/<sha256>`), encrypted by the EncryptedObjectStore wrapper. Each tool has a TTL.
Values are JSON. An output records its *authority*: every credential (name, version) read while it was
fetched (`Context.tool` records them). A hit is served only while each of them is still at that version, so
after a revocation (or a new version) the output is fetched again, never replayed from a grant that no
longer holds. The authority is kept in the `credential` column as canonical JSON (`[["crm", 3], ...]`, sorted,
`credential_version` NULL); a row from before (one name in `credential`, its version in `credential_version`)
reads as a list of one.

Every output belongs to a *scope*: `kind:<agent kind>` (the SDK's default: one agent kind never reads what
another fetched, since the same tool name and arguments can mean different things to them) or `shared`
(tenant-wide, asked for explicitly). Rows written before scopes existed carry `legacy`, which no lookup asks
for: they are unreachable and age out by their TTL; the content-addressed large copies they point to are
shared by content hash and stay valid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import psycopg

from agent_runtime.codec import canonical_json, sha256_hex
from agent_runtime.errors import CorruptState, SnapshotMissing
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["LEGACY_SCOPE", "SHARED_SCOPE", "Authority", "ToolCache", "kind_scope"]

# The credentials an output was fetched under: (name, version) pairs, sorted.
Authority = tuple[tuple[str, int], ...]

# Tenant-wide outputs (`ctx.tool(..., shared=True)`).
SHARED_SCOPE = "shared"
# Rows from before scopes (runtime migration 14): never asked for, so never served to any kind.
LEGACY_SCOPE = "legacy"


def kind_scope(kind: str) -> str:
    """The scope of an agent kind's own outputs; the prefix keeps a kind named `shared` apart from SHARED_SCOPE."""
    return f"kind:{kind}"


def _encode_authority(authority: Iterable[tuple[str, int]]) -> tuple[str | None, None]:
    pairs = sorted({(str(name), int(version)) for name, version in authority})
    return (canonical_json([list(p) for p in pairs]) if pairs else None), None


def _decode_authority(tool: str, credential: str | None, credential_version: int | None) -> Authority:
    if credential is None:
        return ()
    if credential_version is not None:  # written before outputs recorded every credential they read
        return ((credential, int(credential_version)),)
    try:
        return tuple((str(name), int(version)) for name, version in json.loads(credential))
    except (ValueError, TypeError) as exc:
        raise CorruptState(f"cached output of {tool} has an unreadable authority") from exc


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

    def lookup(self, tool: str, args: Any, holds: Callable[[str, int], bool] | None = None,
               required: Collection[str] = (), *, scope: str) -> tuple[bool, Any]:
        """(True, output) when a fresh output of (tool, args) is cached in `scope` and may be served, else
        (False, None). An expired output is never served: the caller recomputes it.

        `holds(name, version)` says whether that credential is still at that version now; it is asked once per
        credential the output recorded (an output that recorded any is never served without it). `required`:
        credentials the caller works under, which the output must have been fetched under too.
        """
        row = self.conn.execute(
            "SELECT inline_value, object_key, content_hash, credential, credential_version FROM tool_cache"
            " WHERE scope = %s AND tool = %s AND args_hash = %s"
            " AND (expires_at IS NULL OR expires_at > clock_timestamp())",
            (scope, tool, self.args_hash(args)),
        ).fetchone()
        if row is None:
            return self._miss()
        inline, key, content_hash, credential, credential_version = row
        recorded = _decode_authority(tool, credential, credential_version)
        if not set(required) <= {name for name, _version in recorded}:
            return self._miss()  # fetched without the grant this caller works under: not its to replay
        if recorded and (holds is None or not all(holds(name, version) for name, version in recorded)):
            return self._miss()  # a grant it was fetched under no longer holds (revoked, or a new version)
        try:
            data = bytes(inline) if inline is not None else self.store.get(key)
        except SnapshotMissing:
            return self._miss()  # the large copy is gone: pay again rather than fail
        if sha256_hex(data) != content_hash:
            raise CorruptState(f"cached output of {tool} failed its content hash")
        self.hits += 1
        return True, json.loads(data)

    def _miss(self) -> tuple[bool, Any]:
        self.misses += 1
        return False, None

    def store_result(self, tool: str, args: Any, value: Any, authority: Iterable[tuple[str, int]] = (), *,
                     scope: str, ttl_s: float | None = None) -> None:
        """Record `value` as the output of (tool, args) in `scope`, fetched under the credentials in `authority`.

        `ttl_s`: seconds the output stays fresh, declared next to the call; None takes the instance's table
        (per tool, else the default).
        """
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl of tool {tool!r} must be a positive number of seconds, not {ttl_s!r}")
        data = canonical_json(value).encode()
        content_hash = sha256_hex(data)
        inline: bytes | None = data
        key: str | None = None
        if len(data) > self.inline_max:
            key = f"cas/{content_hash[:2]}/{content_hash}"
            if not self.store.exists(key):
                self.store.put(key, data)
            inline = None
        ttl = ttl_s if ttl_s is not None else self.ttl_s.get(tool, self.default_ttl_s)
        credential, credential_version = _encode_authority(authority)
        self.conn.execute(
            "INSERT INTO tool_cache (scope, tool, args_hash, inline_value, object_key, size, content_hash,"
            " expires_at, credential, credential_version) VALUES (%s, %s, %s, %s, %s, %s, %s,"
            " CASE WHEN %s::float8 IS NULL THEN NULL ELSE clock_timestamp() + make_interval(secs => %s) END, %s, %s)"
            " ON CONFLICT (scope, tool, args_hash) DO UPDATE SET inline_value = EXCLUDED.inline_value,"
            " object_key = EXCLUDED.object_key, size = EXCLUDED.size, content_hash = EXCLUDED.content_hash,"
            " created_at = clock_timestamp(), expires_at = EXCLUDED.expires_at, credential = EXCLUDED.credential,"
            " credential_version = EXCLUDED.credential_version",
            (scope, tool, self.args_hash(args), inline, key, len(data), content_hash, ttl, ttl, credential,
             credential_version),
        )

    def cached(self, tool: str, args: Any, call: Callable[[], Any], *, scope: str, ttl_s: float | None = None) -> Any:
        """The cached output of (tool, args) in `scope`, else `call()`'s, stored: for calls that read no
        credential (`Context.tool` records the credentials a call reads and serves under them)."""
        hit, value = self.lookup(tool, args, scope=scope)
        if hit:
            return value
        value = call()
        self.store_result(tool, args, value, scope=scope, ttl_s=ttl_s)
        return value
