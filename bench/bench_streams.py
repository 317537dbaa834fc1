"""Reply streams at scale: N reply streams open at once (``BENCH_STREAMS_N``, 1,000; issue 39), time to each
one's first event, the streams refused, failed or left without an event, and the web processes' threads and RSS.

Three servers in the same run, rounds interleaved (the order rotates each round, ``BENCH_STREAMS_ROUNDS``):
- ``direct`` (the anchor): the same streams read from the instance itself, signed as the control plane signs;
- ``gthread``: the control plane under the production web config (deploy/gunicorn.conf.py: 2 threaded workers
  x 16 threads, a thread per stream until the reply ends);
- ``asgi``: the same config with ``GUNICORN_SERVER=asgi``, the reply-stream tier (controlplane/asgi.py: uvicorn
  workers, streams on the event loop).
Streams are held open: the conversational test agent (``tests.runtime.agents``, kind ``chat``) holds its step
after the first word while a file exists (``chat_hold_file``), so each message's reply stream stays open (the
instance sends ``status``, then keep-alives), as a long model reply would. Each round opens N streams at once on
one asyncio client (httpx), waits until every stream has its first event or ``BENCH_STREAMS_WAIT_S`` passed,
samples the web processes, closes them all; every web server is started afresh before its round (streams a
threaded worker still holds for a client that left would otherwise spill into the next round), and the next round
waits ``BENCH_STREAMS_GAP_S`` for the instance to notice the closed streams (its keep-alive write, every 10 s).
Last, the hold is released and one stream through each server must end with ``reply`` then ``end``.
The operator throttle is raised for this run only (N messages and N streams per round come from one operator).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
from bench import _run, _setup  # noqa: E402
from bench._pg import free_port  # noqa: E402

N = _run.size("BENCH_STREAMS_N", 1000, smoke=4)
TENANTS = _run.size("BENCH_STREAMS_TENANTS", 4, smoke=1)
ROUNDS = _run.size("BENCH_STREAMS_ROUNDS", 2, smoke=1)
WAIT_S = _run.seconds("BENCH_STREAMS_WAIT_S", 30.0, smoke=20.0)
GAP_S = _run.seconds("BENCH_STREAMS_GAP_S", 22.0, smoke=0.5)
POST_CONCURRENCY = 8
HOLD_NAME = "chat-hold"  # in each instance's volume, its working directory (as tests/conversation_helpers.py)
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_POLL_INTERVAL_S": "0.05",
         "AGENT_CONFIG": json.dumps({"chat_hold_file": HOLD_NAME})}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _stack  # noqa: E402
from instances.signing import sign  # noqa: E402
from provisioning.models import ProvisionedResource  # noqa: E402
from provisioning.resources.spec import tenant_spec  # noqa: E402

console = Console(width=150)
SERVERS = ("direct", "gthread", "asgi")


# What the instance sends first on a held stream; anything else first (``queued``, ``interrupted``, ``error``) is
# the control plane answering for an instance it could not reach, and counts as failed.
INSTANCE_EVENTS = ("status", "delta", "reply", "end")


@dataclass
class Round:
    first_event_s: list[float] = field(default_factory=list)
    instance_first: Counter[str] = field(default_factory=Counter)  # the instance's first events
    other_first: Counter[str] = field(default_factory=Counter)  # first events not from the instance
    statuses: Counter[int] = field(default_factory=Counter)  # of the refused ones
    refused: int = 0  # an HTTP status other than 200
    failed: int = 0  # no HTTP answer: connection refused or reset
    no_event: int = 0  # answered (or not) but no event within WAIT_S
    threads: int = 0
    rss_mb: float = 0.0


def process_tree(pid: int) -> tuple[int, float]:
    """(threads, RSS in MB) of a process and its children (gunicorn's master and workers)."""
    threads, rss = 0, 0
    try:
        parent = psutil.Process(pid)
        for proc in [parent, *parent.children(recursive=True)]:
            threads += proc.num_threads()
            rss += proc.memory_info().rss
    except psutil.NoSuchProcess:
        pass
    return threads, rss / 2**20


async def one_stream(client: httpx.AsyncClient, url: str, headers: dict[str, str], out: Round,
                     decided: asyncio.Semaphore, release: asyncio.Event, t0: float) -> None:
    """One stream up to its first event, then held until the round ends. A stream decided (a first event,
    refused, failed) releases ``decided`` once; what ends otherwise (no event in time, cancelled at the round's
    end) is counted by ``stream_round`` as the rest."""
    answered = False
    try:
        async with client.stream("GET", url, headers=headers) as resp:
            answered = True
            if resp.status_code != 200:
                out.refused += 1
                out.statuses[resp.status_code] += 1
                decided.release()
                return
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                    if kind not in INSTANCE_EVENTS:
                        out.other_first[kind] += 1
                        out.failed += 1
                        decided.release()
                        return
                    out.first_event_s.append(time.perf_counter() - t0)
                    out.instance_first[kind] += 1
                    decided.release()
                    await release.wait()  # held open until the round ends
                    return
    except httpx.TimeoutException:
        pass
    except (httpx.HTTPError, OSError) as exc:
        if not answered:
            out.failed += 1
            out.other_first[type(exc).__name__] += 1
            decided.release()


async def stream_round(urls_headers: list[tuple[str, dict[str, str]]], pid: int | None) -> Round:
    out = Round()
    decided, release = asyncio.Semaphore(0), asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(WAIT_S, connect=WAIT_S)) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one_stream(client, url, headers, out, decided, release, t0))
                 for url, headers in urls_headers]

        async def all_decided() -> None:
            for _ in tasks:
                await decided.acquire()

        try:
            await asyncio.wait_for(all_decided(), WAIT_S)
        except TimeoutError:
            pass
        if pid is not None:  # every stream is open now (or waiting): the web tier at its fullest
            out.threads, out.rss_mb = process_tree(pid)
        release.set()
        await asyncio.sleep(0)  # the held streams return and close
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out.no_event = len(tasks) - len(out.first_event_s) - out.refused - out.failed
    return out


async def read_whole(url: str, headers: dict[str, str]) -> list[str]:
    """Every event name of one stream, to its end."""
    async with httpx.AsyncClient(timeout=60) as client, client.stream("GET", url, headers=headers) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"GET {url}: {resp.status_code} {(await resp.aread())[:300]!r}")
        return [line[6:].strip() async for line in resp.aiter_lines() if line.startswith("event:")]


async def post_messages(port: int, targets: list[tuple[str, dict[str, str]]], n: int) -> list[str]:
    """``n`` messages, spread over the tenants ``targets`` ((tenant id, headers)) in turn; their inbox ids."""
    sem = asyncio.Semaphore(POST_CONCURRENCY)

    async def post(client: httpx.AsyncClient, tid: str, bearer: dict[str, str]) -> str:
        async with sem:
            resp = await client.post(f"http://127.0.0.1:{port}/api/v1/tenants/{tid}/threads/load/messages",
                                     json={"content": "hello there"},
                                     headers={**bearer, "Idempotency-Key": uuid.uuid4().hex})
            if resp.status_code not in (201, 202):
                raise RuntimeError(f"POST message: {resp.status_code} {resp.text[:300]}")
            return str(resp.json()["inbox"]["id"])

    async with httpx.AsyncClient(timeout=60) as client:
        return list(await asyncio.gather(*(post(client, *targets[i % len(targets)]) for i in range(n))))


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * N + 1024))  # the client's N sockets, and the servers inherit it too
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    call_command("migrate", verbosity=0)
    ports = {"gthread": free_port(), "asgi": free_port()}
    base = f"http://127.0.0.1:{ports['gthread']}"
    settings.CONTROL_PLANE_INTERNAL_URL = base
    settings.INSTANCE_EXTRA_ENV = EXTRA
    env = {**os.environ, "CONTROL_PLANE_INTERNAL_URL": base, "THROTTLE_OPERATOR_RATE": f"{100 * N + 1000}/min"}
    webs: dict[str, subprocess.Popen[bytes]] = {}

    def start(server: str) -> None:
        old = webs.pop(server, None)
        if old is not None and old.poll() is None:
            workers = psutil.Process(old.pid).children(recursive=True)
            old.send_signal(signal.SIGQUIT)  # gunicorn's quick shutdown: what it still holds is dropped
            try:
                old.wait(30)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
            for proc in workers:  # a worker still busy with its open streams outlives its master: not into the next
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
        webs[server] = _stack.web(ports[server], env, server=server)
        _stack.wait_web(ports[server], webs[server])

    rounds: dict[str, list[Round]] = {s: [] for s in SERVERS}
    ends: dict[str, list[str]] = {}
    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instances", _setup.stop_hosts)
        worker = _stack.worker(env)
        cleanup.add("stop the web servers and the worker", lambda: _stack.stop([*webs.values(), worker]))
        start("gthread")
        operator, token = _stack.operator_with_token("bench-streams")
        bearer = {"Authorization": f"Bearer {token}"}
        instances: list[tuple[str, int, str]] = []  # (tenant id, instance port, instance token)
        holds: list[Path] = []
        for t in range(TENANTS):
            tenant = _stack.onboard(operator, f"streams-{t}")
            volume = ProvisionedResource.objects.get(tenant=tenant, kind="volume").details["path"]
            holds.append(Path(volume) / HOLD_NAME)
            holds[-1].write_text("hold")
            instances.append((str(tenant.id), int((Path(volume) / ".host" / "http-port").read_text()),
                              tenant_spec(tenant, with_secrets=("instance_token",)).secrets["instance_token"]))
        console.print(f"Posting {N} messages over {TENANTS} tenants (one thread each; the first one's step holds, "
                      "the rest wait) ...")
        mids = asyncio.run(post_messages(ports["gthread"], [(tid, bearer) for tid, _, _ in instances], N))

        def streams(server: str) -> list[tuple[str, dict[str, str]]]:
            out = []
            for i, mid in enumerate(mids):
                tid, inst_port, inst_token = instances[i % TENANTS]
                if server == "direct":
                    path = f"/v1/threads/load/messages/{mid}/reply"
                    out.append((f"http://127.0.0.1:{inst_port}{path}",
                                {"Authorization": sign(inst_token, tid, "GET", path, b""),
                                 "Accept": "text/event-stream"}))
                else:
                    out.append((f"http://127.0.0.1:{ports[server]}/api/v1/tenants/{tid}/threads/load/messages/"
                                f"{mid}/reply", {**bearer, "Accept": "text/event-stream"}))
            return out

        for r in range(ROUNDS):
            order = SERVERS[r % 3:] + SERVERS[:r % 3]
            for server in order:
                if server != "direct":
                    start(server)
                    asyncio.run(stream_round(streams(server)[:4], None))  # warm: connections, signing-key cache
                load = os.getloadavg()[0]
                console.print(f"round {r + 1}: {N} streams at once through {server} (load {load:.1f}) ...")
                result = asyncio.run(stream_round(streams(server), webs[server].pid if server in webs else None))
                rounds[server].append(result)
                if result.instance_first["reply"] or result.instance_first["end"]:
                    raise RuntimeError(f"replies were already there, so no stream was held: {result.instance_first}")
                console.print(f"  {len(result.first_event_s)} with a first event, {result.refused} refused "
                              f"{dict(result.statuses)}, {result.failed} failed {dict(result.other_first)}, "
                              f"{result.no_event} without an event in {WAIT_S:.0f} s")
                time.sleep(GAP_S)
        load_end = os.getloadavg()
        for hold in holds:  # the held steps finish: each tenant's first message's reply is committed
            hold.unlink()
        for server in SERVERS:
            url, headers = streams(server)[0]
            ends[server] = asyncio.run(read_whole(url, headers))
            if ends[server][-2:] != ["reply", "end"]:
                raise RuntimeError(f"{server}: the stream did not end with reply, end: {ends[server]}")
    report(rounds, load_end)


def report(rounds: dict[str, list[Round]], load: tuple[float, float, float]) -> None:
    table = Table(title=f"{N} concurrent reply streams over {TENANTS} instance(s), {ROUNDS} round(s) each, interleaved "
                        f"(load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})")
    for col in ("server", "first event p50", "p95", "with an event", "refused", "failed",
                f"no event in {WAIT_S:.0f} s", "web threads", "web RSS"):
        table.add_column(col)
    figures: dict[str, dict[str, Any]] = {}
    for server in SERVERS:
        rs = rounds[server]
        firsts = [s for r in rs for s in r.first_event_s]
        p50, p95 = _setup.percentiles(firsts) if firsts else (float("nan"), float("nan"))
        fig = {"first_event_p50_ms": p50, "first_event_p95_ms": p95,
               "with_event": sum(len(r.first_event_s) for r in rs) / len(rs),
               "refused": sum(r.refused for r in rs) / len(rs), "failed": sum(r.failed for r in rs) / len(rs),
               "no_event": sum(r.no_event for r in rs) / len(rs),
               "web_threads": max(r.threads for r in rs), "web_rss_mb": max(r.rss_mb for r in rs),
               "refused_statuses": dict(sum((r.statuses for r in rs), Counter())),
               "failed_first": dict(sum((r.other_first for r in rs), Counter()))}
        figures[server] = fig
        web = server != "direct"
        table.add_row(server, f"{p50:.0f} ms", f"{p95:.0f} ms", f"{fig['with_event']:.0f} / {N}",
                      f"{fig['refused']:.0f}", f"{fig['failed']:.0f}", f"{fig['no_event']:.0f}",
                      f"{fig['web_threads']:.0f}" if web else "-", f"{fig['web_rss_mb']:.0f} MB" if web else "-")
    console.print(table)
    served = {s: figures[s]["with_event"] / N for s in SERVERS}
    _run.ratio_line("streams", f"streams with a first event within {WAIT_S:.0f} s, reply-stream tier / direct",
                    served["asgi"] / served["direct"] if served["direct"] else float("nan"),
                    f"(gthread / direct {served['gthread'] / served['direct'] if served['direct'] else 0:.2f}; "
                    f"first event p95 asgi {figures['asgi']['first_event_p95_ms']:.0f} ms, direct "
                    f"{figures['direct']['first_event_p95_ms']:.0f} ms)")
    _run.write_json("streams", {"n": N, "tenants": TENANTS, "rounds": ROUNDS, "wait_s": WAIT_S,
                                "load_average_end": load, "servers": figures})


if __name__ == "__main__":
    main()
