"""Semantic memory at 100,000 documents x 384 dimensions (MiniLM's width) on an embedded pgserver (PostgreSQL 16
with pgvector) that this bench starts in a temporary directory and stops.

Vectors are random (seeded unit vectors around 1,000 random centres; embedding 100,000 real texts with MiniLM
would take about 35 minutes on these 2 cores; recall on real MiniLM embeddings is in the tests). Printed, same run,
same table:
- our `SemanticIndex.search` (query embedding stubbed: a dict lookup) p50/p95 against the raw pgvector HNSW
  statement on the same table (same columns, same binary parameter), alternating query by query. Goal <= 1.2x.
- an instance's RSS growth (a fresh process: connect, boot, 200 searches). Goal < 20 MB, independent of N.
- boot read-back (`SemanticIndex.boot`) with the 100,000-row index present vs an empty schema, boot by boot in
  alternation in one process (after the RSS figure is taken).
- the fallback layout (float32 bytes + NumPy pages, as on a server without pgvector) on the same vectors.
JSON copy in var/bench/semantic.json. Env: BENCH_SEMANTIC_DOCS (100000), BENCH_SEMANTIC_QUERIES (200).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.db import connect  # noqa: E402
from agent_runtime.state.migrations import migrate  # noqa: E402
from agent_runtime.state.objectstore import FileObjectStore  # noqa: E402
from agent_runtime.state.semantic import SemanticIndex  # noqa: E402
from agent_runtime.state.semantic_layout import PgVector, table_for  # noqa: E402
from bench import _run  # noqa: E402
from provisioning.drivers.pg_vector import ensure_vector_extension  # noqa: E402

N = _run.size("BENCH_SEMANTIC_DOCS", 100_000, smoke=2_000)
QUERIES = _run.size("BENCH_SEMANTIC_QUERIES", 200, smoke=10)
BOOTS = 20
DIM = 384
MODEL = "bench-random-384"
console = Console(width=130)


CENTRES = 1000


def unit(seed: int, n: int) -> np.ndarray:
    """n random unit vectors around 1,000 random centres (a Gaussian mixture; seed 0 fixes the centres): real
    embeddings cluster by topic, and uniformly random vectors in 384 dimensions have no near neighbours to find."""
    centres = np.random.default_rng(0).standard_normal((CENTRES, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, CENTRES, n)] + rng.standard_normal((n, DIM)).astype(np.float32) * (0.6 / DIM**0.5)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class IndexEmbedder:
    """'doc <i>' -> the i-th document vector, 'q <j>' -> the j-th query vector: no model in the timings."""

    name = MODEL

    def __init__(self, docs: np.ndarray | None, queries: np.ndarray) -> None:
        self.docs, self.queries = docs, queries

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            kind, i = t.split(" ")
            src = self.queries if kind == "q" else self.docs
            assert src is not None
            out.append(src[int(i)])
        return out  # arrays: the index takes anything np.asarray takes


def percentiles(ms: list[float]) -> tuple[float, float]:
    s = sorted(ms)
    return statistics.median(s), s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


def tenant(admin_dsn: str) -> tuple[str, str]:
    """A tenant role + schema as provisioning makes them (no rights on public, USAGE on `extensions`)."""
    tag = uuid.uuid4().hex[:8]
    role, schema = f"rt_{tag}", f"t_{tag}"
    with psycopg.connect(admin_dsn) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(tag)))
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role)))
        admin.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        ensure_vector_extension(admin, role)
    return psycopg.conninfo.make_conninfo(admin_dsn, user=role, password=tag), schema


# --- the instance side, in a fresh process ------------------------------------------------------------------
def instance(dsn: str, schema: str, objects: str, layout: str, searches: int,
             anchor: tuple[str, str] | None = None) -> dict[str, Any]:
    """RSS growth over BOOTS boots and ``searches`` searches; then, given an ``anchor`` (dsn, schema), BOOTS boots
    of each schema in alternation (each boot on its own connection, opened before either is timed)."""
    proc = psutil.Process()
    queries = unit(2, max(searches, 1))
    conn = connect(dsn, schema, autocommit=True)
    anchor_conn = connect(anchor[0], anchor[1], autocommit=True) if anchor else None
    store = FileObjectStore(Path(objects))
    embedder = IndexEmbedder(None, queries)
    for c in (conn, anchor_conn):
        if c is not None:
            SemanticIndex(c, store, embedder, layout=layout).boot()  # warm: catalog caches, prepared plans
    rss0 = proc.memory_info().rss

    def boot(c: psycopg.Connection) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        info = SemanticIndex(c, store, embedder, layout=layout).boot()
        return (time.perf_counter() - t0) * 1000, info

    boots = []
    for _ in range(BOOTS):
        took, info = boot(conn)
        boots.append(took)
    idx = SemanticIndex(conn, store, embedder, layout=layout)
    lat = []
    for j in range(searches):
        t0 = time.perf_counter()
        idx.search(f"q {j}", k=10)
        lat.append((time.perf_counter() - t0) * 1000)
    rss1 = proc.memory_info().rss
    out = {"boot_ms_p50": statistics.median(boots), "boot": info, "rss_growth_mb": (rss1 - rss0) / 2**20,
           "search_ms": percentiles(lat) if lat else None}
    if anchor_conn is not None:
        ours, empty = [], []
        for i in range(BOOTS):
            for c in (conn, anchor_conn) if i % 2 == 0 else (anchor_conn, conn):
                (ours if c is conn else empty).append(boot(c)[0])
        out.update(boot_ms_p50=statistics.median(ours), anchor_boot_ms_p50=statistics.median(empty))
    return out


def run_instance(dsn: str, schema: str, objects: Path, layout: str, searches: int,
                 anchor: tuple[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--instance", dsn, schema, str(objects), layout, str(searches),
                          *(anchor or ())], check=True, capture_output=True, text=True, cwd=ROOT)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- the bench ----------------------------------------------------------------------------------------------
def load(dsn: str, schema: str, objects: Path, docs: np.ndarray, layout: str) -> float:
    conn = connect(dsn, schema, autocommit=True)
    migrate(conn, schema)
    idx = SemanticIndex(conn, FileObjectStore(objects), IndexEmbedder(docs, unit(2, 1)), layout=layout)
    conn.execute("SET maintenance_work_mem = '1GB'")  # the HNSW build at the end of the bulk load
    t0 = time.perf_counter()
    idx.add_many(((f"d{i:06d}", f"doc {i}", {"shard": i % 16}) for i in range(len(docs))), batch_size=2000)
    took = time.perf_counter() - t0
    conn.execute("VACUUM ANALYZE " + table_for(MODEL))
    conn.close()
    return took


def compare(dsn: str, schema: str, objects: Path, docs: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Ours vs the raw statement, alternating per query, on one connection; recall against exact search."""
    conn = connect(dsn, schema, autocommit=True)
    idx = SemanticIndex(conn, FileObjectStore(objects), IndexEmbedder(None, queries))
    raw_sql = sql.SQL("SELECT doc_id, text, metadata, embedding OPERATOR(extensions.<=>) %s::extensions.vector AS d"
                      " FROM {} ORDER BY d LIMIT 10").format(sql.Identifier(table_for(MODEL)))
    packed = [PgVector(q) for q in queries]
    for j in range(min(20, len(queries))):  # warm both (prepared statements after 5 runs, index pages cached)
        conn.execute(raw_sql, (packed[j],)).fetchall()
        idx.search(f"q {j}", k=10)
    ours, raw, found = [], [], 0
    for j in range(len(queries)):
        for turn in ((0, 1) if j % 2 else (1, 0)):  # who goes first (and finds the pages cached) alternates
            t0 = time.perf_counter()
            if turn:
                hits = idx.search(f"q {j}", k=10)
                ours.append((time.perf_counter() - t0) * 1000)
            else:
                rows = conn.execute(raw_sql, (packed[j],)).fetchall()
                raw.append((time.perf_counter() - t0) * 1000)
        assert [h.doc_id for h in hits] == [r[0] for r in rows]
        exact = {f"d{i:06d}" for i in np.argpartition(-(docs @ queries[j]), 10)[:10]}
        found += len(exact & {h.doc_id for h in hits})
    conn.close()
    return {"ours_ms": percentiles(ours), "raw_ms": percentiles(raw), "recall_at_10": found / (10 * len(queries))}


def main() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        base = Path(tempfile.mkdtemp(prefix="bench-sem-"))
        os.environ.setdefault("XDG_RUNTIME_DIR", str(base / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(str(base / "pg"), cleanup_mode="stop")
    try:
        uri = server.get_uri()
        with psycopg.connect(uri, autocommit=True) as admin:
            admin.execute("CREATE DATABASE bench_semantic")
        admin_dsn = psycopg.conninfo.make_conninfo(uri, dbname="bench_semantic")
        docs, queries = unit(1, N), unit(2, QUERIES)
        (base / "objects").mkdir()
        (dsn, schema), (dsn_empty, schema_empty), (dsn_fb, schema_fb) = (tenant(admin_dsn) for _ in range(3))
        console.print(f"loading {N:,} x {DIM} synthetic vectors (pgvector layout, HNSW built once at the end)...")
        load_s = load(dsn, schema, base / "objects", docs, "auto")
        with connect(dsn_empty, schema_empty, autocommit=True) as c:
            migrate(c, schema_empty)
        cmp = compare(dsn, schema, base / "objects", docs, queries)
        present = run_instance(dsn, schema, base / "objects", "auto", QUERIES, anchor=(dsn_empty, schema_empty))
        console.print(f"loading the same vectors in the fallback layout (float32 bytes) in schema {schema_fb}...")
        load_fb_s = load(dsn_fb, schema_fb, base / "objects", docs, "bytea")
        fallback = run_instance(dsn_fb, schema_fb, base / "objects", "bytea", 10)
        with psycopg.connect(admin_dsn) as admin:
            size = admin.execute("SELECT pg_total_relation_size(%s)", (f"{schema}.{table_for(MODEL)}",)).fetchone()
    finally:
        with _run.Cleanup() as cleanup:  # the data directory goes too: a full run leaves ~1 GB otherwise
            cleanup.add("remove the server's directory", shutil.rmtree, base, True)
            cleanup.add("stop the server", server.cleanup)

    ratio = cmp["ours_ms"][0] / cmp["raw_ms"][0]
    results = {"docs": N, "dim": DIM, "queries": QUERIES, "load_s": load_s, "load_fallback_s": load_fb_s,
               "table_mb": (size[0] if size else 0) / 2**20, **cmp, "p50_ratio": ratio, "instance": present,
               "fallback": fallback}
    table = Table(title=f"Semantic memory: {N:,} docs x {DIM} dims, pgvector 0.6 HNSW (m=16, ef_search=40)")
    for col in ("measure", "ours", "anchor", "ratio / goal"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    table.add_row("search k=10, p50 / p95 (ms)", "{:.2f} / {:.2f}".format(*cmp["ours_ms"]),
                  "raw HNSW query {:.2f} / {:.2f}".format(*cmp["raw_ms"]),
                  f"{ratio:.2f}x (goal <= 1.2x) {'OK' if ratio <= 1.2 else 'MISSED'}")
    growth = present["rss_growth_mb"]
    table.add_row("instance RSS growth: boot x21 + searches (MB)", f"{growth:.1f}", "-",
                  f"goal < 20 MB {'OK' if growth < 20 else 'MISSED'}")
    boot_ratio = present["boot_ms_p50"] / present["anchor_boot_ms_p50"]
    table.add_row("boot read-back p50 (ms), alternating", f"{present['boot_ms_p50']:.2f} (index present)",
                  f"{present['anchor_boot_ms_p50']:.2f} (empty)", f"{boot_ratio:.2f}x (goal: unchanged)")
    table.add_row("recall@10 vs exact search (these synthetic vectors)", f"{cmp['recall_at_10']:.3f}", "-", "-")
    fb = fallback["search_ms"]
    table.add_row("fallback layout search p50 / p95 (ms), 10 queries", f"{fb[0]:.0f} / {fb[1]:.0f}", "-", "-")
    table.add_row("fallback instance RSS growth (MB)", f"{fallback['rss_growth_mb']:.1f}", "-", "-")
    table.add_row("bulk load incl. HNSW build (s)", f"{load_s:.1f}", f"fallback {load_fb_s:.1f}", "-")
    table.add_row("table + indexes (MB)", f"{results['table_mb']:.0f}", "-", "-")
    console.print(table)
    _run.ratio_line("semantic", "search k=10 p50, ours / raw HNSW query", ratio, "(goal <= 1.2x)")
    _run.ratio_line("semantic", "boot read-back p50, index present / empty schema", boot_ratio, "(goal: 1x)")
    _run.write_json("semantic", results)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--instance":
        print(json.dumps(instance(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]),
                                  (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else None)))
        raise SystemExit(0)
    raise SystemExit(main())
