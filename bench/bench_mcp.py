"""Benchmark: an MCP tool call through the SDK from inside an agent step vs the official `mcp` client calling the
same server directly, same machine, same run (issue 34).

The server: the `mcp` SDK's MCPServer over streamable HTTP (`examples/agent_examples/peers/crm.py`, its own
process, bearer token checked), three tools. Ours: `ctx.mcp("peer").call(tool, args)` inside a step run by
`host.runner.run_task` on a `Runtime`, the call alone timed (inside the step): the bearer token read from the
credential source, the routing of its kind, and the call on the process's open session for that server and token
(`mcp.client`):
- read-only (`lookup_order`, distinct arguments each time: a cache miss, so the call is made and its output stored
  in the tool cache), once with the tool's kind pinned by the operator (no tool list needed) and once taken from
  the annotations (the server's tool list, kept by the open session for `TOOLS_TTL_S`);
- destructive (`send_money`): the effect ledger (intent committed before, outcome after, the journal's object),
  over a session of its own (initialize + call), as an effect's call always is.
Anchors: the `mcp` client (`mcp.Client` over `streamable_http_client`) making the same call on a session it keeps
open (the read-only anchor: what ours does), and opening a session per call (the destructive anchor, and shown
for reads as information). Alternating blocks, each side's block after the other's, the order flipped each time.
Run: `python bench/bench_mcp.py`. Goal: <= 1.1x the anchor's p50 for read-only calls; the ledger's cost reported.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psycopg
import redis  # noqa: F401  (bench/_setup's clean-up at exit uses it and cannot import it during shutdown)
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_runtime.db import connect  # noqa: E402
from agent_runtime.host.credentials import InMemoryCredentialSource  # noqa: E402
from agent_runtime.host.runner import Runtime, run_task  # noqa: E402
from agent_runtime.mcp.config import servers_validate  # noqa: E402
from agent_runtime.sdk import Agent, Context  # noqa: E402
from agent_runtime.state import tasks  # noqa: E402
from agent_runtime.state.migrations import migrate  # noqa: E402
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore  # noqa: E402
from bench import _run, _setup  # noqa: E402  (a throwaway database on the server, cleaned up at exit)

N = _run.size("BENCH_MCP_CALLS", 200, smoke=6)
WARMUP = _run.size("BENCH_MCP_WARMUP", 10, smoke=2)
BLOCK = _run.size("BENCH_MCP_BLOCK", 10, smoke=2)
SCHEMA = "mcp_bench"
TOKEN = "bench-" + uuid.uuid4().hex

agent = Agent("mcp-bench")
TIMES: list[float] = []  # the call alone, as the step timed it


@agent.step
def call(ctx: Context) -> dict[str, Any]:
    server = ctx.mcp(str(ctx.params["server"]))
    t0 = time.perf_counter()
    out = server.call(str(ctx.params["tool"]), dict(ctx.params["args"]))
    TIMES.append(time.perf_counter() - t0)
    return {"ok": not out.get("isError")}


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port_file = _setup.TMP / "mcp-peer.port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), os.environ.get("PYTHONPATH", ""))),
           "MCP_PEER_PORT_FILE": str(port_file), "MCP_PEER_CALL_LOG": str(_setup.TMP / "mcp-calls.jsonl"),
           "MCP_PEER_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "agent_examples.peers.crm"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the MCP server did not start")
        time.sleep(0.02)
    return proc, f"http://127.0.0.1:{port_file.read_text()}/mcp"


def make_runtime(url: str) -> Runtime:
    dsn = psycopg.conninfo.make_conninfo(_setup.SERVER_URL, dbname=_setup.DB_NAME)
    conn = connect(dsn, SCHEMA, autocommit=True)
    migrate(conn, SCHEMA)
    tenant_id = str(uuid.uuid4())
    volume = _setup.TMP / "volume"
    volume.mkdir(mode=0o700, exist_ok=True)
    store = EncryptedObjectStore(FileObjectStore(_setup.TMP / "objects"), os.urandom(32), tenant_id)
    servers = servers_validate({
        "peer": {"url": url, "credential": "peer-token"},
        "pinned": {"url": url, "credential": "peer-token", "tools": {"lookup_order": "read_only"}}})
    return Runtime(conn=conn, tenant_id=tenant_id, volume=volume, store=store,
                   credentials=InMemoryCredentialSource({"peer-token": TOKEN}), mcp_servers=servers)


def ours(rt: Runtime, server: str, tool: str, args: dict[str, Any]) -> float:
    tid = tasks.submit(rt.conn, agent.kind, {"server": server, "tool": tool, "args": args})
    status = run_task(rt, agent, tid)
    assert status == "done", status
    return TIMES[-1]


class Raw:
    """The `mcp` SDK's client against the same server: a session per call, or one kept open."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _client(self, stack: AsyncExitStack) -> Any:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        async def open_() -> Any:
            http = await stack.enter_async_context(create_mcp_http_client(
                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=httpx2.Timeout(30)))
            return await stack.enter_async_context(Client(streamable_http_client(self.url, http_client=http),
                                                          cache=None, read_timeout_seconds=30))
        return open_()

    def per_call(self, tool: str, args: dict[str, Any]) -> float:
        import anyio

        async def run() -> float:
            t0 = time.perf_counter()
            async with AsyncExitStack() as stack:
                client = await self._client(stack)
                await client.call_tool(tool, args)
            return time.perf_counter() - t0

        return anyio.run(run)

    def kept_open(self, calls: list[tuple[str, dict[str, Any]]]) -> list[float]:
        import anyio

        async def run() -> list[float]:
            out = []
            async with AsyncExitStack() as stack:
                client = await self._client(stack)
                for tool, args in calls:
                    t0 = time.perf_counter()
                    await client.call_tool(tool, args)
                    out.append(time.perf_counter() - t0)
            return out

        return anyio.run(run)


def p50_p95(samples_s: list[float]) -> tuple[float, float]:
    ms = [s * 1000 for s in samples_s]
    p95 = statistics.quantiles(ms, n=20)[18] if len(ms) >= 20 else max(ms)
    return statistics.median(ms), p95


def main() -> None:
    with psycopg.connect(psycopg.conninfo.make_conninfo(_setup.SERVER_URL, dbname=_setup.DB_NAME),
                         autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    with _run.Cleanup() as cleanup:
        proc, url = start_server()
        cleanup.add("stop the MCP server", proc.kill)
        rt = make_runtime(url)
        cleanup.add("close the runtime's connection", rt.conn.close)
        raw = Raw(url)
        counter = iter(range(10**9))

        def read(_: int) -> dict[str, Any]:
            return {"order_id": f"o-{next(counter)}"}  # distinct: a cache miss, the call is made

        def pay(_: int) -> dict[str, Any]:
            return {"to": f"acct_{next(counter)}", "amount": 1}

        def each(fn: Callable[[int], float]) -> Callable[[int, int], list[float]]:
            return lambda start, n: [fn(start + i) for i in range(n)]

        sides: dict[str, Callable[[int, int], list[float]]] = {
            "read-only, ours (kind pinned)": each(lambda i: ours(rt, "pinned", "lookup_order", read(i))),
            "read-only, ours (from annotations)": each(lambda i: ours(rt, "peer", "lookup_order", read(i))),
            "read-only, mcp client (session kept open)": lambda start, n: raw.kept_open(
                [("lookup_order", read(start + i)) for i in range(n)]),
            "read-only, mcp client (session per call, info)": each(lambda i: raw.per_call("lookup_order",
                                                                                          read(i))),
            "destructive, ours (effect ledger)": each(lambda i: ours(rt, "peer", "send_money", pay(i))),
            "destructive, mcp client": each(lambda i: raw.per_call("send_money", pay(i))),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for fn in sides.values():
            fn(0, WARMUP)
        for block in range(max(1, N // BLOCK)):
            order = list(sides.items())
            for name, fn in order if block % 2 == 0 else order[::-1]:  # who goes first alternates
                times[name].extend(fn(block * BLOCK, BLOCK))
        effects = rt.conn.execute("SELECT count(*) FROM effects WHERE effect = 'mcp:peer/send_money' "
                                  "AND state = 'committed'").fetchone()
        assert effects is not None and effects[0] == WARMUP + len(times["destructive, ours (effect ledger)"])

        out: dict[str, dict[str, float]] = {}
        for name, samples in times.items():
            p50, p95 = p50_p95(samples)
            out[name] = {"p50_ms": p50, "p95_ms": p95, "calls": len(samples)}
            print(f"{name}: p50 {p50:.2f} ms, p95 {p95:.2f} ms ({len(samples)} calls)", flush=True)
        anchor_read = out["read-only, mcp client (session kept open)"]["p50_ms"]
        anchor_pay = out["destructive, mcp client"]["p50_ms"]
        ledger_ms = out["destructive, ours (effect ledger)"]["p50_ms"] - anchor_pay
        print(f"load average {os.getloadavg()[0]:.1f}; the ledger's cost per destructive call at p50: "
              f"{ledger_ms:+.2f} ms", flush=True)
        per_call = out["read-only, mcp client (session per call, info)"]["p50_ms"]
        pinned = out["read-only, ours (kind pinned)"]["p50_ms"] / anchor_read
        annotated = out["read-only, ours (from annotations)"]["p50_ms"] / anchor_read
        effect = out["destructive, ours (effect ledger)"]["p50_ms"] / anchor_pay
        _run.ratio_line("mcp", "read-only MCP call, ctx.mcp (kind pinned) / mcp client p50", pinned, "(goal <= 1.1x)")
        _run.ratio_line("mcp", "read-only MCP call, ctx.mcp (kind from annotations) / mcp client p50", annotated,
                        "(goal <= 1.1x)")
        _run.ratio_line("mcp", "read-only MCP call, ctx.mcp (kind pinned) / mcp client, session per call p50",
                        out["read-only, ours (kind pinned)"]["p50_ms"] / per_call, "(information)")
        _run.ratio_line("mcp", "destructive MCP call, ctx.mcp (effect ledger) / mcp client p50", effect,
                        "(reported)")
        _run.write_json("mcp", {"sides": out, "ratios_p50": {"read_only_pinned": pinned,
                                                             "read_only_annotations": annotated,
                                                             "destructive_ledger": effect},
                                "ledger_ms_p50": ledger_ms, "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
