"""Benchmark: per-turn persistence of a 500-turn conversation, ours vs LangGraph's PostgresSaver vs a
plain append (floor), in the same database and run; plus boot read-back with 100k messages and 10k
checkpoints. Run: `python bench/bench_runtime.py` (needs `langgraph-checkpoint-postgres>=3,<4`)."""

from __future__ import annotations

import os
import random
import statistics
import string
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_runtime.codec import estimate_tokens  # noqa: E402
from agent_runtime.host.credentials import InMemoryCredentialSource  # noqa: E402
from agent_runtime.state import tasks  # noqa: E402
from agent_runtime.state.checkpoints import FORMAT_VERSION, CaseDelta, CheckpointStore, _cp_checksum  # noqa: E402
from agent_runtime.state.memory import MemoryStore, _message_checksum  # noqa: E402
from agent_runtime.state.migrations import migrate  # noqa: E402
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore  # noqa: E402
from agent_runtime.state.workspace import EMPTY_DIGEST  # noqa: E402

ADMIN_DSN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TURNS = 500
MSG = "m" * 400  # fixed filler only for the boot data set


def msg(rng: random.Random) -> str:
    """400 bytes of incompressible-ish text, like real messages (repeated filler would flatter TOAST)."""
    return "".join(rng.choice(string.ascii_letters + "      ") for _ in range(400))


TEXTS = [msg(random.Random(i)) for i in range(2 * TURNS)]  # generated before any timing


def schema_conn(dsn: str, schema: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")


def rel_size(conn: psycopg.Connection, schema: str, tables: list[str]) -> int:
    total = 0
    for t in tables:
        row = conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (f"{schema}.{t}",)).fetchone()
        total += int(row[0] or 0)
    return total


def bench_ours(dsn: str) -> tuple[list[float], int]:
    texts = iter(TEXTS)
    conn = schema_conn(dsn, "ours")
    migrate(conn, "ours")
    mem, cps = MemoryStore(conn, thread="bench"), CheckpointStore(conn)
    tid = tasks.submit(conn, "chat", {})
    times = []
    for turn in range(1, TURNS + 1):
        t0 = time.perf_counter()
        with conn.transaction():
            mem.append_many([("user", next(texts), {}), ("assistant", next(texts), {})])
            cps.commit(tid, "turn", CaseDelta(notes={"turn": turn}), workspace_digest=EMPTY_DIGEST, ledger_pos=0,
                       seq=turn)
        times.append(time.perf_counter() - t0)
    size = rel_size(conn, "ours", ["messages", "checkpoints", "case_entries"])
    conn.close()
    return times, size


def bench_langgraph(dsn: str) -> tuple[list[float], int]:
    texts = iter(TEXTS)
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                           options="-c search_path=lg")
    saver = PostgresSaver(conn)
    saver.setup()
    config = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    messages: list[dict[str, str]] = []
    times = []
    for turn in range(1, TURNS + 1):
        t0 = time.perf_counter()
        new = [{"role": "user", "content": next(texts)}, {"role": "assistant", "content": next(texts)}]
        messages = messages + new
        cp = create_checkpoint(cp, None, turn)
        cp["channel_values"] = {"messages": messages}
        cp["channel_versions"] = {"messages": turn}
        config = saver.put(config, cp, {"source": "loop", "step": turn, "parents": {}}, {"messages": turn})
        saver.put_writes(config, [("messages", new)], task_id=str(uuid.uuid4()))  # the node's pending write
        times.append(time.perf_counter() - t0)
    conn.close()
    with schema_conn(dsn, "lg") as plain:
        size = rel_size(plain, "lg", ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"])
    return times, size


def bench_floor(dsn: str) -> tuple[list[float], int]:
    texts = iter(TEXTS)
    conn = schema_conn(dsn, "floor")
    conn.execute("CREATE TABLE messages (id bigserial PRIMARY KEY, thread text NOT NULL, role text NOT NULL,"
                 " content text NOT NULL)")
    times = []
    for _ in range(TURNS):
        t0 = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("INSERT INTO messages (thread, role, content) VALUES ('bench', 'user', %s)", (next(texts),))
            cur.execute("INSERT INTO messages (thread, role, content) VALUES ('bench', 'assistant', %s)",
                        (next(texts),))
        times.append(time.perf_counter() - t0)
    size = rel_size(conn, "floor", ["messages"])
    conn.close()
    return times, size


def bench_boot(dsn: str, n_messages: int = 100_000, n_checkpoints: int = 10_000) -> float:
    from agent_runtime.host.config import HostConfig
    from agent_runtime.host.process import Host
    from agent_runtime.host.runner import Runtime

    conn = schema_conn(dsn, "boot")
    migrate(conn, "boot")
    tid = tasks.submit(conn, "demo", {})
    conn.execute("UPDATE tasks SET status = 'running' WHERE id = %s", (tid,))
    with conn.cursor() as cur, cur.copy("COPY messages (thread, role, content, metadata, tokens, checksum)"
                                        " FROM STDIN") as copy:
        for i in range(n_messages):
            role = "user" if i % 2 == 0 else "assistant"
            content = f"{i} " + MSG
            copy.write_row(("main", role, content, "{}", estimate_tokens(content),
                            _message_checksum("main", role, content, {})))
    with conn.transaction():
        cps = CheckpointStore(conn, prune_every=0)
        with conn.cursor() as cur, cur.copy("COPY checkpoints (task_id, seq, branch, step, kind, format_version,"
                                            " workspace_digest, ledger_pos, checksum) FROM STDIN") as copy:
            for seq in range(1, n_checkpoints):
                copy.write_row((tid, seq, 0, f"step{seq}", "step", FORMAT_VERSION, EMPTY_DIGEST, 0,
                                _cp_checksum(tid, seq, 0, f"step{seq}", "step", FORMAT_VERSION, EMPTY_DIGEST, 0, None)))
        cps.commit(tid, "last", CaseDelta(done={"last": True}), workspace_digest=EMPTY_DIGEST, ledger_pos=0,
                   seq=n_checkpoints)
    conn.execute("ANALYZE")
    conn.close()
    tmp = Path(tempfile.mkdtemp())
    cfg = HostConfig(tenant_id=str(uuid.uuid4()), schema="boot", database_url=dsn, volume=tmp,
                     objectstore_url=f"file://{tmp}/o/", object_key=os.urandom(32), memory_token_budget=4000)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        c = schema_conn(dsn, "boot")
        migrate(c, "boot")
        host = Host(cfg)
        rt = Runtime(conn=c, tenant_id=cfg.tenant_id, volume=tmp,
                     store=EncryptedObjectStore(FileObjectStore(tmp / "o"), cfg.object_key, cfg.tenant_id),
                     credentials=InMemoryCredentialSource())
        summary = host.read_back_state(rt)
        samples.append(time.perf_counter() - t0)
        assert summary["resumable"] and summary["resumable"][0]["step"] == "last"
        c.close()
    return statistics.median(samples)


def main() -> None:
    tag = uuid.uuid4().hex[:8]
    dbname = f"rt_bench_{tag}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            for s in ("ours", "lg", "floor", "boot"):
                c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(s)))
        results = {}
        for name, fn in (("floor (plain append)", bench_floor), ("ours", bench_ours),
                         ("langgraph PostgresSaver", bench_langgraph)):
            results[name] = fn(dsn)
        boot_s = bench_boot(dsn)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))

    floor_turn = statistics.mean(results["floor (plain append)"][0])
    table = Table(title=f"{TURNS}-turn conversation, 2 x 400-byte messages per turn (same DB, same run)")
    for col in ("store", "total s", "first-20 ms/turn", "last-20 ms/turn", "last/first", "x floor/turn",
                "storage MB"):
        table.add_column(col, justify="right")
    for name, (times, size) in results.items():
        first, last = statistics.mean(times[:20]) * 1000, statistics.mean(times[-20:]) * 1000
        table.add_row(name, f"{sum(times):.2f}", f"{first:.2f}", f"{last:.2f}", f"{last / first:.2f}",
                      f"{statistics.mean(times) / floor_turn:.2f}", f"{size / 1e6:.3f}")
    console = Console(width=140)
    console.print(table)
    ours_size, lg_size = results["ours"][1], results["langgraph PostgresSaver"][1]
    console.print(f"storage: langgraph / ours = {lg_size / ours_size:.1f}x (goal >= 10x)")
    console.print(f"boot read-back with 100,000 messages and 10,000 checkpoints: {boot_s * 1000:.1f} ms "
                  "(goal < 200 ms; median of 5, includes connect + migrate check)")


if __name__ == "__main__":
    main()
