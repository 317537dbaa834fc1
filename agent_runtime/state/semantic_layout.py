"""The two physical layouts of a semantic index table and the detection that picks one.

One table per embedding model (`semantic_<12 hex of the model name>`), created by the index code the first
time the model stores a vector, never by a versioned migration: migrations are the same on every server,
while the `embedding` column's type depends on the server. `pgvector`: `vector(n)` from the extension's
schema (the control plane creates the extension in a schema tenants may USAGE, typically `extensions`)
with an HNSW index (cosine), searched in SQL. `bytea`: float32 little-endian bytes, scored with NumPy over
pages of a server-side cursor. Both keep doc_id (the key, "C" collation so a prefix filter is a range of
the primary key), content hash (no re-embedding of known content), text and `metadata jsonb` (GIN).

Everything else (which model is active, a re-embedding in progress) is in the versioned `semantic_models`
table. No I/O here beyond the catalog queries and DDL of `ensure_table`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

from agent_runtime.codec import sha256_hex
from agent_runtime.errors import ConfigError, CorruptState
from agent_runtime.state.fence import ensure_fences

__all__ = ["HNSW_MAX_DIM", "Layout", "LayoutName", "ModelRow", "PgVector", "create_hnsw", "create_table", "drop_hnsw",
           "register_adapters", "table_for", "vector_schema", "Vector"]

LayoutName = Literal["pgvector", "bytea"]

# pgvector's HNSW indexes vectors of at most 2,000 dimensions; wider models use the bytea layout.
HNSW_MAX_DIM = 2000

# NumPy is imported where vectors are made, not with this module: a host imports it at boot (the semantic index's
# read-back), and an idle instance should not carry NumPy's ~15 MiB for an index nobody searches.
if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Vector = NDArray[np.float32]
else:
    Vector = Any


class PgVector:
    """A vector in pgvector's binary wire format (uint16 dim, uint16 unused, float4 big-endian)."""

    __slots__ = ("data",)

    def __init__(self, vec: Vector) -> None:
        self.data = struct.pack(">HH", len(vec), 0) + vec.astype(">f4").tobytes()


class _PgVectorDumper(Dumper):
    # Sent untyped in binary; the `::<schema>.vector` cast in the statement makes the server use vector_recv.
    format = Format.BINARY
    oid = 0

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


def vector_schema(conn: psycopg.Connection) -> str | None:
    """The schema of the `vector` extension if this role may use it, else None (no pgvector here)."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'vector' AND has_schema_privilege(n.oid, 'USAGE')").fetchone()
    return str(row[0]) if row else None


def register_adapters(conn: psycopg.Connection) -> None:
    """Let `PgVector` values be sent on `conn` (binary, so no float formatting on either side)."""
    conn.adapters.register_dumper(PgVector, _PgVectorDumper)


def table_for(model: str) -> str:
    return "semantic_" + sha256_hex(model)[:12]


@dataclass(frozen=True)
class Layout:
    name: LayoutName
    dim: int
    ext_schema: str | None = None  # pgvector only

    @staticmethod
    def choose(requested: str, ext_schema: str | None, dim: int) -> Layout:
        if requested == "bytea":
            return Layout("bytea", dim)
        if ext_schema is None or dim > HNSW_MAX_DIM:
            if requested == "pgvector":
                raise ConfigError("AGENT semantic layout 'pgvector' requested, but the vector extension is not"
                                  f" usable by this role here (or {dim} > {HNSW_MAX_DIM} dimensions)")
            return Layout("bytea", dim)
        return Layout("pgvector", dim, ext_schema)

    # --- SQL pieces -------------------------------------------------------------------------------
    def ext(self, name: str) -> sql.Composable:
        assert self.ext_schema is not None
        return sql.SQL("{}.{}").format(sql.Identifier(self.ext_schema), sql.SQL(name))

    @property
    def param(self) -> sql.Composable:
        """Placeholder for one vector parameter."""
        if self.name == "pgvector":
            return sql.SQL("%s::{}").format(self.ext("vector"))
        return sql.SQL("%s")

    @property
    def distance_op(self) -> sql.Composable:
        return sql.SQL("OPERATOR({})").format(self.ext("<=>"))

    def column_type(self) -> sql.Composable:
        if self.name == "pgvector":
            return sql.SQL("{}({})").format(self.ext("vector"), sql.Literal(self.dim))
        return sql.SQL("bytea")

    # --- values -----------------------------------------------------------------------------------
    def to_db(self, vec: Vector) -> object:
        if len(vec) != self.dim:
            raise ConfigError(f"the embedder returned {len(vec)} dimensions, this index holds {self.dim}")
        if self.name == "pgvector":
            return PgVector(vec)
        return vec.astype("<f4").tobytes()

    def from_db(self, raw: bytes) -> Vector:
        """Decode one stored vector (pgvector's binary form or float32 bytes); CorruptState if truncated."""
        if self.name == "pgvector":
            raw = raw[4:]
            dtype = ">f4"
        else:
            dtype = "<f4"
        if len(raw) != 4 * self.dim:
            raise CorruptState(f"embedding has {len(raw) // 4} floats, expected {self.dim} (truncated row)")
        import numpy as np

        return np.frombuffer(raw, dtype=dtype).astype(np.float32)



@dataclass(frozen=True)
class ModelRow:
    model: str
    table: str
    layout: Layout
    state: str  # 'active' | 'filling' (being re-embedded from `fill_from`)
    fill_from: str | None
    fill_cursor: str | None

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.table)


def create_table(conn: psycopg.Connection, table: str, layout: Layout, *, hnsw: bool = True) -> None:
    """The model's table and its indexes (idempotent); the HNSW index only in the pgvector layout, and not
    yet when `hnsw` is False (a bulk load builds it at its end)."""
    t = sql.Identifier(table)
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {t} (doc_id text COLLATE \"C\" PRIMARY KEY, content_hash text NOT NULL,"
        " text text NOT NULL, metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb, embedding {ty} NOT NULL,"
        " updated_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(t=t, ty=layout.column_type()))
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (content_hash)").format(
        sql.Identifier(table + "_hash"), t))
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING gin (metadata jsonb_path_ops)").format(
        sql.Identifier(table + "_meta"), t))
    if layout.name == "pgvector" and hnsw:
        create_hnsw(conn, table, layout)
    schema = conn.execute("SELECT current_schema()").fetchone()
    assert schema is not None
    ensure_fences(conn, str(schema[0]))


def create_hnsw(conn: psycopg.Connection, table: str, layout: Layout) -> None:
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding {})").format(
        sql.Identifier(table + "_hnsw"), sql.Identifier(table), layout.ext("vector_cosine_ops")))


def drop_hnsw(conn: psycopg.Connection, table: str) -> None:
    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(table + "_hnsw")))
