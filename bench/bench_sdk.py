"""Benchmark: durable cost of one SDK agent step with one effect, ours vs DBOS Transact, same server, same run.

Ours: an `agent_runtime.sdk.Agent` with one step calling `ctx.effect("charge", args)`, submitted with
`tasks.submit` and run by `host.runner.run_task` on a `Runtime` (task row, step events, effect intent and
outcome, checkpoint + case entry + 'done' in one transaction, task status). DBOS: a `@DBOS.workflow()`
calling one `@DBOS.step()`, started synchronously (workflow status row, inputs, step output, status).
Both call the same in-process no-op effect adapter, so what is timed is durable-step overhead, not
network. Each system's database lives on the same PostgreSQL server (DBOS in its own database); the two are
timed in alternating blocks so machine drift hits both alike, once against DBOS as it comes and once
against DBOS without SQLAlchemy's per-checkout ping.

Wire counts come from libpq's protocol trace (`PGconn.trace`) of separate, untimed runs: round trips are
ReadyForQuery messages, statements are executed queries other than BEGIN/COMMIT and pings, durable commits
are transactions that ran an INSERT, UPDATE or DELETE (of which asynchronous: a statement set synchronous_commit
off for its transaction; marked '~' in the sequence). In pipeline mode psycopg awaits an answer mid-transaction with
a Flush, which brings no ReadyForQuery: each Flush counts as a round trip too. Time outside PostgreSQL (e.g. our
effect journal's object-store writes) shows in the timings only.
Run: `python bench/bench_sdk.py` (needs the `bench` extra: `dbos`). Goal: ours <= 1x DBOS per step.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_runtime.db import connect  # noqa: E402
from agent_runtime.effects.base import LookupResult  # noqa: E402
from agent_runtime.host.credentials import InMemoryCredentialSource  # noqa: E402
from agent_runtime.host.runner import Runtime, run_task  # noqa: E402
from agent_runtime.sdk import Agent, Context  # noqa: E402
from agent_runtime.state import tasks  # noqa: E402
from agent_runtime.state.migrations import migrate  # noqa: E402
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore  # noqa: E402
from bench import _run, _setup  # noqa: E402  (a throwaway database on the server, cleaned up at exit)

N = _run.size("BENCH_SDK_TASKS", 300, smoke=6)
WARMUP = _run.size("BENCH_SDK_WARMUP", 30, smoke=3)
BLOCK = _run.size("BENCH_SDK_BLOCK", 10, smoke=2)  # tasks per alternating block: short, so load bursts hit both
COUNT_WINDOWS = _run.size("BENCH_SDK_COUNT_WINDOWS", 15, smoke=2)  # untimed, traced tasks per system (wire counts)
PREPARED = 10  # untimed tasks before the counted ones: past psycopg's prepare threshold, as in the timed run
SERVER_URL = _setup.SERVER_URL
SCHEMA = "sdk_bench"
DBOS_DB = f"dbos_bench_{_setup.RUN_ID}"


class NoopCharge:
    """The provider both systems call: answers at once, so only the durable bookkeeping is timed."""

    supports_lookup = False
    replay_safe = True

    def __init__(self) -> None:
        self.calls = 0

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"id": f"ch_{idem_key[-12:]}", "amount": args["amount"], "status": "succeeded"}

    def lookup(self, idem_key: str) -> LookupResult:
        return LookupResult.unknown("the no-op provider keeps no record")


def params(i: int) -> dict[str, Any]:
    return {"amount": 1000 + i, "currency": "eur", "customer": f"cus_{i:06d}"}


# --- the wire trace --------------------------------------------------------------------------------
_LIBC = ctypes.CDLL(None)  # the process's libc: libpq's trace streams are its FILEs


class WireTrace:
    """libpq protocol traces, one file per connection, read back by windows (file offsets).

    Every connection is traced from the moment it opens (toggling a trace is unsafe on a connection another
    thread may be using); libpq writes through a buffered stdio stream, so `fflush(NULL)` before each mark
    makes the file sizes exact. Timestamps are kept: they put the transactions of several connections in
    order.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []

    def attach(self, pgconn: Any) -> None:
        path = self.directory / f"conn-{len(self.files)}.trace"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.files.append(path)
        pgconn.trace(fd)
        pgconn.set_trace_flags(psycopg.pq.Trace.REGRESS_MODE)

    def mark(self) -> list[int]:
        _LIBC.fflush(None)
        return [p.stat().st_size for p in self.files]

    def window(self, start: list[int]) -> dict[str, Any]:
        """Counts of the traffic since `start` on every traced connection, transactions in time order."""
        _LIBC.fflush(None)
        out: dict[str, Any] = {"round_trips": 0, "statements": 0, "durable_commits": 0, "async_commits": 0}
        transactions: list[tuple[str, str]] = []
        for i, path in enumerate(self.files):
            # The whole file is read: a statement prepared before the window is executed by name inside it.
            text = path.read_bytes().decode("latin-1")  # one char per byte: offsets stay file offsets
            transactions += _count(text, start[i] if i < len(start) else 0, out)
        out["sequence"] = [body for _ts, body in sorted(transactions)]
        return out


_MESSAGE = re.compile(r"^(\S+ \S+)\t([FB])\t\d+\t(\w+)(?:\t ?)?", re.M)  # timestamp, direction, length, type
_WRITE = re.compile(r"^\s*(?:WITH\b.*?\(\s*)?(INSERT|UPDATE|DELETE)\b", re.I | re.S)
_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")
# A statement that makes its own transaction's commit asynchronous (`agent_runtime.state.tasks.ASYNC_COMMIT`).
_ASYNC = "set_config('synchronous_commit', 'off', true)"


def _label(sql_text: str) -> str:
    """What a statement does: its verb, or the write verb of a data-modifying CTE (`WITH x AS (UPDATE ...)`)."""
    write = _WRITE.search(sql_text)
    if write:
        return write.group(1).upper()
    words = sql_text.split()
    return words[0].upper() if words else "ping"  # SQLAlchemy's pool_pre_ping sends an empty query


def _count(text: str, start: int, out: dict[str, Any]) -> list[tuple[str, str]]:
    """Add one connection's counts since offset `start` to `out`; return its transactions (end time, body)."""
    prepared: dict[str, str] = {}  # statement name -> label, for Bind by name
    transactions: list[tuple[str, str]] = []
    segment: list[str] = []  # statements since the connection was last idle: one transaction
    matches = list(_MESSAGE.finditer(text))
    for n, m in enumerate(matches):
        body = text[m.end():matches[n + 1].start() if n + 1 < len(matches) else len(text)]
        ts, direction, kind = m.groups()
        quoted = body.split('"', 4)  # Parse: "name" "query...; Bind: "portal" "statement" params
        if direction == "F" and kind == "Parse":
            query = quoted[3] + quoted[4] if len(quoted) > 4 else ""
            prepared[quoted[1]] = _label(query) + ("~" if _ASYNC in query else "")
        if m.start() < start:
            continue
        if direction == "F" and kind == "Query":
            label = _label(body.strip().strip('"').strip(";")) + ("~" if _ASYNC in body else "")
        elif direction == "F" and kind == "Bind":
            label = prepared.get(quoted[3] if len(quoted) > 3 else "", "?")
        elif direction == "F" and kind == "Flush":  # pipeline mode: an answer awaited without a Sync
            out["round_trips"] += 1
            continue
        elif direction == "B" and kind == "ReadyForQuery":
            out["round_trips"] += 1
            if body.strip() == "I" and segment:
                if any(t.rstrip("~") in ("INSERT", "UPDATE", "DELETE") for t in segment):
                    out["durable_commits"] += 1
                    # Asynchronous: the commit does not wait for the WAL flush (marked '~' in the sequence).
                    out["async_commits"] += any(t.endswith("~") for t in segment)
                work = [t for t in segment if t not in _CONTROL]
                transactions.append((ts, work[0] if len(work) == 1 else "[" + " ".join(work) + "]"))
                segment = []
            continue
        else:
            continue
        segment.append(label)
        if label not in _CONTROL and label != "ping":
            out["statements"] += 1
    return transactions


def fewest(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's own traffic: background pollers (DBOS's queue and scheduler threads) only ever add to a window."""
    return min(windows, key=lambda w: w["round_trips"])


# --- ours ------------------------------------------------------------------------------------------
agent = Agent("bench-charge")


@agent.step
def charge(ctx: Context) -> dict[str, Any]:
    return ctx.effect("charge", ctx.params)


def make_runtime(provider: NoopCharge, trace: WireTrace | None = None) -> Runtime:
    dsn = psycopg.conninfo.make_conninfo(SERVER_URL, dbname=_setup.DB_NAME)
    conn = connect(dsn, SCHEMA, autocommit=True)
    migrate(conn, SCHEMA)
    if trace is not None:
        trace.attach(conn.pgconn)
    tenant_id = str(uuid.uuid4())
    volume = _setup.TMP / "volume"
    volume.mkdir(mode=0o700, exist_ok=True)
    store = EncryptedObjectStore(FileObjectStore(_setup.TMP / "objects"), os.urandom(32), tenant_id)
    return Runtime(conn=conn, tenant_id=tenant_id, volume=volume, store=store,
                   credentials=InMemoryCredentialSource(), effects={"charge": provider})


def ours_once(rt: Runtime, i: int) -> float:
    t0 = time.perf_counter()
    status = run_task(rt, agent, tasks.submit(rt.conn, agent.kind, params(i)))
    elapsed = time.perf_counter() - t0
    assert status == "done", status
    return elapsed


# --- DBOS ------------------------------------------------------------------------------------------
def dbos_workflow(provider: NoopCharge) -> tuple[Any, Callable[[dict[str, Any]], dict[str, Any]]]:
    from dbos import DBOS

    @DBOS.step()
    def charge_step(args: dict[str, Any]) -> dict[str, Any]:
        # DBOS's idempotency key for a step: the workflow id and the step's position in it.
        return provider.perform(f"{DBOS.workflow_id}:{DBOS.step_id}", args)

    @DBOS.workflow()
    def charge_workflow(args: dict[str, Any]) -> dict[str, Any]:
        return charge_step(args)

    return DBOS, charge_workflow


# DBOS as it comes, and without SQLAlchemy's per-checkout ping (a tuning a DBOS user could make), so the
# ratio does not rest on a default of theirs.
DBOS_VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "pool_pre_ping off": {"db_engine_kwargs": {"pool_pre_ping": False}},
}


def dbos_launch(dbos: Any, variant: str) -> None:
    dbos(config={"name": "bench-sdk", "system_database_url": SERVER_URL.rsplit("/", 1)[0] + "/" + DBOS_DB,
                 "log_level": "WARNING", **DBOS_VARIANTS[variant]})
    dbos.launch()


def dbos_once(workflow: Callable[[dict[str, Any]], dict[str, Any]], i: int) -> float:
    t0 = time.perf_counter()
    result = workflow(params(i))
    elapsed = time.perf_counter() - t0
    assert result["status"] == "succeeded", result
    return elapsed


# --- the run ---------------------------------------------------------------------------------------
def count_ours(provider: NoopCharge) -> dict[str, Any]:
    trace = WireTrace(_setup.TMP / "trace-ours")
    rt = make_runtime(provider, trace)
    for i in range(PREPARED):
        ours_once(rt, -1 - i)
    windows = []
    for i in range(COUNT_WINDOWS):
        start = trace.mark()
        ours_once(rt, -100 - i)
        windows.append(trace.window(start))
    rt.conn.close()
    return fewest(windows)


def count_dbos(dbos: Any, workflow: Callable[[dict[str, Any]], dict[str, Any]], variant: str) -> dict[str, Any]:
    """A separate, traced DBOS lifecycle: every connection its engine opens is traced from its first byte."""
    trace = WireTrace(_setup.TMP / f"trace-dbos-{len(list(_setup.TMP.glob('trace-dbos-*')))}")

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        trace.attach(dbapi_conn.pgconn)

    sa.event.listen(sa.pool.Pool, "connect", on_connect)
    try:
        dbos_launch(dbos, variant)
        for i in range(PREPARED):
            dbos_once(workflow, -1 - i)
        time.sleep(1.0)  # lets DBOS's start-up work in its own threads finish before the windows
        windows = []
        for i in range(COUNT_WINDOWS):
            start = trace.mark()
            dbos_once(workflow, -100 - i)
            windows.append(trace.window(start))
        dbos.destroy()
    finally:
        sa.event.remove(sa.pool.Pool, "connect", on_connect)
    return fewest(windows)


def timed(rt: Runtime, dbos: Any, workflow: Callable[[dict[str, Any]], dict[str, Any]], variant: str
          ) -> dict[str, list[float]]:
    """N tasks each, ours and DBOS in alternating blocks, after a warm-up of both."""
    dbos_launch(dbos, variant)
    for i in range(WARMUP):
        ours_once(rt, 10_000 + i)
        dbos_once(workflow, 10_000 + i)
    times: dict[str, list[float]] = {"ours": [], "dbos": [], "ours_cpu": [], "dbos_cpu": []}
    for block in range(0, N, BLOCK):
        # Alternate which one goes first so neither always follows the other's checkpoint/vacuum work.
        order = ("ours", "dbos") if (block // BLOCK) % 2 == 0 else ("dbos", "ours")
        for name in order:
            cpu = time.process_time()  # the whole process: DBOS's own threads count for DBOS
            for i in range(block, min(N, block + BLOCK)):
                times[name].append(ours_once(rt, i) if name == "ours" else dbos_once(workflow, i))
            times[f"{name}_cpu"].append((time.process_time() - cpu) / (min(N, block + BLOCK) - block))
    dbos.destroy()
    return times


def main() -> None:
    with psycopg.connect(SERVER_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBOS_DB)))
    with psycopg.connect(psycopg.conninfo.make_conninfo(SERVER_URL, dbname=_setup.DB_NAME), autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    provider = NoopCharge()
    dbos, workflow = dbos_workflow(provider)
    try:
        counts = {"ours": count_ours(provider)}
        counts.update({f"DBOS, {v}": count_dbos(dbos, workflow, v) for v in DBOS_VARIANTS})
        rt = make_runtime(provider)
        runs = {variant: timed(rt, dbos, workflow, variant) for variant in DBOS_VARIANTS}
        rt.conn.close()
        per_system = PREPARED + COUNT_WINDOWS + len(DBOS_VARIANTS) * (WARMUP + N)
        # Every effect performed exactly once per task: ours once, DBOS once per variant for its counting run.
        assert provider.calls == 2 * per_system + (len(DBOS_VARIANTS) - 1) * (PREPARED + COUNT_WINDOWS), provider.calls
    finally:
        with psycopg.connect(SERVER_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DBOS_DB)))

    dbos_version = importlib.metadata.version("dbos")
    console = Console(width=160)
    table = Table(title=f"One agent step with one effect: {N} tasks each after {WARMUP} warm-up, same PostgreSQL "
                        f"server, same run, alternating blocks of {BLOCK}")
    for col in ("anchor", "ours p50 ms", "ours p95 ms", "DBOS p50 ms", "DBOS p95 ms", "ours/DBOS p50",
                "ours/DBOS p95", "client CPU ms/task ours / DBOS"):
        table.add_column(col, justify="right")
    out: dict[str, Any] = {"tasks": N, "warmup": WARMUP, "dbos_version": dbos_version, "runs": {}, "counts": counts}
    for variant, times in runs.items():
        (o50, o95), (d50, d95) = _setup.percentiles(times["ours"]), _setup.percentiles(times["dbos"])
        ocpu, dcpu = (statistics.mean(times[f"{name}_cpu"]) * 1000 for name in ("ours", "dbos"))
        table.add_row(f"DBOS {dbos_version}, {variant}", f"{o50:.2f}", f"{o95:.2f}", f"{d50:.2f}", f"{d95:.2f}",
                      f"{o50 / d50:.2f}x", f"{o95 / d95:.2f}x", f"{ocpu:.2f} / {dcpu:.2f}")
        out["runs"][variant] = {"ours_p50_ms": o50, "ours_p95_ms": o95, "ours_mean_ms": statistics.mean(
            times["ours"]) * 1000, "dbos_p50_ms": d50, "dbos_p95_ms": d95, "dbos_mean_ms": statistics.mean(
            times["dbos"]) * 1000, "ratio_p50": o50 / d50, "ratio_p95": o95 / d95,
            "ours_cpu_ms": ocpu, "dbos_cpu_ms": dcpu}
    console.print(table)
    wire = Table(title=f"Per task on the wire (libpq trace; the quietest of {COUNT_WINDOWS} untimed tasks)")
    for col in ("system", "round trips", "statements", "durable commits (~ async)", "transactions in order"):
        wire.add_column(col, justify="right" if col != "transactions in order" else "left")
    for name, c in counts.items():
        wire.add_row(name, str(c["round_trips"]), str(c["statements"]),
                     f"{c['durable_commits']} ({c['async_commits']})", " ".join(c["sequence"]))
    console.print(wire)
    head = out["runs"]["defaults"]
    console.print(f"ours / DBOS (defaults) per step: p50 {head['ratio_p50']:.2f}x, p95 {head['ratio_p95']:.2f}x "
                  "(goal <= 1x)")
    _run.ratio_line("sdk", "one durable step, ours / DBOS (defaults) p50", head["ratio_p50"],
                    f"(DBOS {head['dbos_p50_ms']:.2f} ms; goal <= 1x)")
    _run.write_json("sdk", out)


if __name__ == "__main__":
    main()
