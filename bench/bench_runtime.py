"""Benchmark: per-turn persistence of a 500-turn conversation, ours vs LangGraph's PostgresSaver vs a
plain append (floor), in the same database and run, turn by turn in rotating order (turn i of each store, who goes
first rotating), so load on the machine hits all three alike; plus boot read-back with 100k messages and 10k
checkpoints. Run: `python bench/bench_runtime.py` (needs `langgraph-checkpoint-postgres>=3,<4`).
``BENCH_RUNTIME_TURNS`` (500), ``BENCH_BOOT_MESSAGES`` (100,000), ``BENCH_BOOT_CHECKPOINTS`` (10,000).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import string
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from bench import _run  # noqa: E402

ADMIN_DSN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TURNS = _run.size("BENCH_RUNTIME_TURNS", 500, smoke=20)
BOOT_MESSAGES = _run.size("BENCH_BOOT_MESSAGES", 100_000, smoke=2_000)
BOOT_CHECKPOINTS = _run.size("BENCH_BOOT_CHECKPOINTS", 10_000, smoke=200)
EDGE = min(20, TURNS)  # turns averaged at each end: "first-20" and "last-20"
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


class Store:
    """One way of persisting the conversation: ``turn(i)`` writes turn i (1-based) and returns its seconds."""

    def turn(self, turn: int) -> float:
        raise NotImplementedError

    def finish(self) -> int:
        """Close; the bytes it stored."""
        raise NotImplementedError


class Ours(Store):
    def __init__(self, dsn: str) -> None:
        self.conn = schema_conn(dsn, "ours")
        migrate(self.conn, "ours")
        self.mem, self.cps = MemoryStore(self.conn, thread="bench"), CheckpointStore(self.conn)
        self.tid = tasks.submit(self.conn, "chat", {})

    def turn(self, turn: int) -> float:
        user, assistant = TEXTS[2 * turn - 2], TEXTS[2 * turn - 1]
        t0 = time.perf_counter()
        with self.conn.transaction():
            self.mem.append_many([("user", user, {}), ("assistant", assistant, {})])
            self.cps.commit(self.tid, "turn", CaseDelta(notes={"turn": turn}), workspace_digest=EMPTY_DIGEST,
                            ledger_pos=0, seq=turn)
        return time.perf_counter() - t0

    def finish(self) -> int:
        size = rel_size(self.conn, "ours", ["messages", "checkpoints", "case_entries"])
        self.conn.close()
        return size


class LangGraph(Store):
    def __init__(self, dsn: str) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                                    options="-c search_path=lg")
        self.saver = PostgresSaver(self.conn)  # type: ignore[arg-type]
        self.saver.setup()
        self.config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        self.cp = empty_checkpoint()
        self.messages: list[dict[str, str]] = []

    def turn(self, turn: int) -> float:
        from langgraph.checkpoint.base import create_checkpoint

        user, assistant = TEXTS[2 * turn - 2], TEXTS[2 * turn - 1]
        t0 = time.perf_counter()
        new = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        self.messages = self.messages + new
        self.cp = create_checkpoint(self.cp, None, turn)
        self.cp["channel_values"] = {"messages": self.messages}
        self.cp["channel_versions"] = {"messages": turn}
        self.config = self.saver.put(self.config, self.cp, {"source": "loop", "step": turn, "parents": {}},
                                     {"messages": turn})
        self.saver.put_writes(self.config, [("messages", new)], task_id=str(uuid.uuid4()))  # the node's write
        return time.perf_counter() - t0

    def finish(self) -> int:
        self.conn.close()
        with schema_conn(self.dsn, "lg") as plain:
            return rel_size(plain, "lg", ["checkpoints", "checkpoint_blobs", "checkpoint_writes",
                                          "checkpoint_migrations"])


class Floor(Store):
    def __init__(self, dsn: str) -> None:
        self.conn = schema_conn(dsn, "floor")
        self.conn.execute("CREATE TABLE messages (id bigserial PRIMARY KEY, thread text NOT NULL,"
                          " role text NOT NULL, content text NOT NULL)")

    def turn(self, turn: int) -> float:
        user, assistant = TEXTS[2 * turn - 2], TEXTS[2 * turn - 1]
        t0 = time.perf_counter()
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute("INSERT INTO messages (thread, role, content) VALUES ('bench', 'user', %s)", (user,))
            cur.execute("INSERT INTO messages (thread, role, content) VALUES ('bench', 'assistant', %s)",
                        (assistant,))
        return time.perf_counter() - t0

    def finish(self) -> int:
        size = rel_size(self.conn, "floor", ["messages"])
        self.conn.close()
        return size


STORES: dict[str, Callable[[str], Store]] = {
    "floor (plain append)": Floor, "ours": Ours, "langgraph PostgresSaver": LangGraph}


def conversation(dsn: str) -> dict[str, tuple[list[float], int]]:
    """Every store's per-turn seconds and storage: turn i of each, the order rotating from turn to turn."""
    stores = {name: make(dsn) for name, make in STORES.items()}
    names = list(stores)
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(1, TURNS + 1):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(stores[name].turn(turn))
    return {name: (times[name], stores[name].finish()) for name in names}


def bench_boot(dsn: str, n_messages: int, n_checkpoints: int) -> float:
    """Median seconds of 5 boots' read-back (connect, migrate check, every read a host does before it is ready to
    act) over ``n_messages`` logged messages and ``n_checkpoints`` checkpoints of a task in flight."""

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
    tmp = Path(tempfile.mkdtemp(prefix="cp-bench-runtime-"))
    try:
        return _boot_samples(dsn, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _boot_samples(dsn: str, tmp: Path) -> float:
    from agent_runtime.host.config import HostConfig
    from agent_runtime.host.process import Host
    from agent_runtime.host.runner import Runtime

    cfg = HostConfig(tenant_id=str(uuid.uuid4()), schema="boot", database_url=dsn, volume=tmp,
                     objectstore_url=f"file://{tmp}/o/", object_key=os.urandom(32), memory_token_budget=4000,
                     agent_app="agent_examples.demo:AGENTS")  # the agent whose task is in flight
    samples = []
    for _ in range(5):
        host = Host(cfg)
        # A host loads its agents before the read-back (which needs them: it unblocks their kinds' tasks); that
        # is an import, not a read, and is not timed here.
        if not host.load_agents():
            raise RuntimeError(f"the demo agent did not load: {host.load_error}")
        t0 = time.perf_counter()
        c = schema_conn(dsn, "boot")
        migrate(c, "boot")
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
        results = conversation(dsn)
        boot_s = bench_boot(dsn, BOOT_MESSAGES, BOOT_CHECKPOINTS)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))

    floor_turn = statistics.mean(results["floor (plain append)"][0])
    table = Table(title=f"{TURNS}-turn conversation, 2 x 400-byte messages per turn (same DB, same run, turns "
                        "interleaved)")
    for col in ("store", "total s", f"first-{EDGE} ms/turn", f"last-{EDGE} ms/turn", "last/first", "x floor/turn",
                "storage MB"):
        table.add_column(col, justify="right")
    for name, (times, size) in results.items():
        first, last = statistics.mean(times[:EDGE]) * 1000, statistics.mean(times[-EDGE:]) * 1000
        table.add_row(name, f"{sum(times):.2f}", f"{first:.2f}", f"{last:.2f}", f"{last / first:.2f}",
                      f"{statistics.mean(times) / floor_turn:.2f}", f"{size / 1e6:.3f}")
    console = Console(width=140)
    console.print(table)
    ours_size, lg_size = results["ours"][1], results["langgraph PostgresSaver"][1]
    console.print(f"storage: langgraph / ours = {lg_size / ours_size:.1f}x (goal >= 10x)")
    console.print(f"boot read-back with {BOOT_MESSAGES:,} messages and {BOOT_CHECKPOINTS:,} checkpoints: "
                  f"{boot_s * 1000:.1f} ms (goal < 200 ms; median of 5, includes connect + migrate check)")
    ours_turn = statistics.mean(results["ours"][0])
    _run.ratio_line("runtime", "ours / floor per turn, mean", ours_turn / floor_turn,
                    f"(floor {floor_turn * 1000:.2f} ms; goal < 3x)")
    _run.ratio_line("runtime", "storage, PostgresSaver / ours", lg_size / ours_size, "(goal >= 10x)")


if __name__ == "__main__":
    main()
