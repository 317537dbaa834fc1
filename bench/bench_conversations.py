"""Conversation benchmark: a message's round trip through the control plane into the instance's log, and the
latency of the first streamed chunk of the reply, each against a direct signed call to the instance in the same
run (the anchor). Goal: proxy overhead <= 5 ms at p50.

Real parts: the control plane under gunicorn with the production config (deploy/gunicorn.conf.py: gthread
workers, persistent database connections), a Celery worker for onboarding, a real
agent-host with the conversational test agent (`tests.runtime.agents:AGENTS`, kind `chat`), PostgreSQL.
Samples alternate direct / proxied, who goes first alternating too, so drift hits both alike.
``BENCH_MESSAGES`` (200), ``BENCH_STREAMS`` (50).

Also what each message's task costs the control plane after the hop: the instance asks for its agent configuration
once per task (`GET /internal/v1/agent-config`, `BENCH_CONFIG_FETCHES`, 200), alternated with the direct call to
the instance, whose p50 it is printed against.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
from bench import _run, _setup  # noqa: E402
from bench._http import first_chunk, request  # noqa: E402
from bench._pg import free_port  # noqa: E402

N = _run.size("BENCH_MESSAGES", 200, smoke=4)
N_STREAM = _run.size("BENCH_STREAMS", 50, smoke=2)
WARMUP = _run.size("BENCH_CONVERSATION_WARMUP", 40, smoke=3)
N_CONFIG = _run.size("BENCH_CONFIG_FETCHES", 200, smoke=3)
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_POLL_INTERVAL_S": "0.05"}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _stack  # noqa: E402
from instances.signing import sign  # noqa: E402
from provisioning.models import ProvisionedResource  # noqa: E402
from provisioning.resources.spec import tenant_spec  # noqa: E402

console = Console(width=140)


def alternate(pair: tuple[Callable[[], float], Callable[[], float]], i: int) -> tuple[float, float]:
    """(direct, proxied) seconds of one sample each, the direct one first on even ``i``."""
    direct, proxied = pair
    if i % 2 == 0:
        d = direct()
        return d, proxied()
    p = proxied()
    return direct(), p


def main() -> None:
    call_command("migrate", verbosity=0)
    web_port = free_port()
    base = f"http://127.0.0.1:{web_port}"
    settings.CONTROL_PLANE_INTERNAL_URL = base
    settings.INSTANCE_EXTRA_ENV = EXTRA
    env = {**os.environ, "CONTROL_PLANE_INTERNAL_URL": base}
    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instances", _setup.stop_hosts)  # last: with the worker gone, nothing restarts them
        web = _stack.web(web_port, env)
        worker = _stack.worker(env)
        cleanup.add("stop the web server and the worker", _stack.stop, [web, worker])
        operator, token = _stack.operator_with_token("bench-talk")
        tenant = _stack.onboard(operator, "talk")
        volume = ProvisionedResource.objects.get(tenant=tenant, kind="volume").details["path"]
        inst_port = int((Path(volume) / ".host" / "http-port").read_text())
        inst_token = tenant_spec(tenant, with_secrets=("instance_token",)).secrets["instance_token"]
        tid = str(tenant.id)
        bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        _stack.wait_web(web_port, web)

        def direct(thread: str) -> tuple[float, str]:
            mid = str(uuid.uuid4())
            path = f"/v1/threads/{thread}/messages"
            body = json.dumps({"id": mid, "content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, raw = request(inst_port, "POST", path, body, {
                "Authorization": sign(inst_token, tid, "POST", path, body), "Content-Type": "application/json"})
            took = time.perf_counter() - t0
            if status != 201:
                raise RuntimeError(f"direct POST: {status} {raw[:300]!r}")
            return took, mid

        def proxied(thread: str) -> tuple[float, str]:
            body = json.dumps({"content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, raw = request(web_port, "POST", f"/api/v1/tenants/{tid}/threads/{thread}/messages", body,
                                  {**bearer, "Idempotency-Key": uuid.uuid4().hex})
            took = time.perf_counter() - t0
            if status not in (201, 202):
                raise RuntimeError(f"proxied POST: {status} {raw[:300]!r}")
            out = json.loads(raw)
            if out["inbox"]["status"] != "delivered":
                raise RuntimeError(f"proxied POST: {status} {out}")
            return took, str(out["inbox"]["id"])

        def direct_first() -> float:  # from sending the message to the first chunk of its reply
            t0 = time.perf_counter()
            _, mid = direct("st")
            path = f"/v1/threads/st/messages/{mid}/reply"
            first_chunk(inst_port, path, {"Authorization": sign(inst_token, tid, "GET", path, b"")}, timeout=30)
            return time.perf_counter() - t0

        def proxied_first() -> float:
            t0 = time.perf_counter()
            _, mid = proxied("st")
            first_chunk(web_port, f"/api/v1/tenants/{tid}/threads/st/messages/{mid}/reply", bearer, timeout=30)
            return time.perf_counter() - t0

        for _ in range(WARMUP):  # warm both paths (every thread's database connection, the signing-key cache)
            direct("warm")
            proxied("warm")
        d_post, p_post = [], []
        console.print(f"Round trip of {N} messages each way (POST, durable in the instance's log, answered) ...")
        for i in range(N):
            d, p = alternate((lambda: direct("rt")[0], lambda: proxied("rt")[0]), i)
            d_post.append(d)
            p_post.append(p)
            time.sleep(0.02)  # let the agent answer: the next sample does not queue behind this one's reply
        d_first, p_first = [], []
        console.print(f"First streamed chunk of {N_STREAM} replies each way ...")
        for i in range(N_STREAM):
            d, p = alternate((direct_first, proxied_first), i)
            d_first.append(d)
            p_first.append(p)
            time.sleep(0.05)

        def config_fetch() -> float:  # what the instance asks once per task, as it asks it
            t0 = time.perf_counter()
            status, raw = request(web_port, "GET", "/internal/v1/agent-config", b"",
                                  {"Authorization": f"Bearer {inst_token}", "Accept": "application/json"})
            if status != 200:
                raise RuntimeError(f"agent-config: {status} {raw[:300]!r}")
            return time.perf_counter() - t0

        d_cfg, p_cfg = [], []
        console.print(f"The instance's configuration fetch, {N_CONFIG} times, against as many direct calls ...")
        for i in range(N_CONFIG):
            d, p = alternate((lambda: direct("cfg")[0], config_fetch), i)
            d_cfg.append(d)
            p_cfg.append(p)
            time.sleep(0.02)
    dp50, dp95 = _setup.percentiles(d_post)
    pp50, pp95 = _setup.percentiles(p_post)
    df50, df95 = _setup.percentiles(d_first)
    pf50, pf95 = _setup.percentiles(p_first)
    c50, c95 = _setup.percentiles(p_cfg)
    dc50, _ = _setup.percentiles(d_cfg)
    table = Table(title="Conversations: control plane vs direct call to the instance (same run, alternating)")
    for col in ("measure", "through the control plane", "direct (anchor)", "overhead"):
        table.add_column(col)
    table.add_row(f"message round trip p50 (n={N})", f"{pp50:.1f} ms", f"{dp50:.1f} ms",
                  f"{pp50 - dp50:+.1f} ms (goal <= 5 ms)")
    table.add_row("message round trip p95", f"{pp95:.1f} ms", f"{dp95:.1f} ms", f"{pp95 - dp95:+.1f} ms")
    table.add_row(f"first streamed chunk p50 (n={N_STREAM})", f"{pf50:.1f} ms", f"{df50:.1f} ms",
                  f"{pf50 - df50:+.1f} ms (send -> first chunk)")
    table.add_row("first streamed chunk p95", f"{pf95:.1f} ms", f"{df95:.1f} ms", "")
    table.add_row(f"the task's configuration fetch p50 (n={N_CONFIG})", f"{c50:.1f} ms", f"{dc50:.1f} ms",
                  f"{c50 / dc50:.2f}x of a direct message call")
    table.add_row("the task's configuration fetch p95", f"{c95:.1f} ms", "", "")
    console.print(table)
    _run.ratio_line("conversations", "message round trip p50, through the control plane / direct", pp50 / dp50,
                    f"(overhead {pp50 - dp50:+.1f} ms; goal <= +5 ms)")
    _run.ratio_line("conversations", "the instance's per-task configuration fetch p50 / a direct message call p50",
                    c50 / dc50, f"({c50:.1f} ms / {dc50:.1f} ms)")
    _run.write_json("conversations", {
        "round_trip_ms": {"proxied_p50": pp50, "proxied_p95": pp95, "direct_p50": dp50, "direct_p95": dp95},
        "first_chunk_ms": {"proxied_p50": pf50, "proxied_p95": pf95, "direct_p50": df50, "direct_p95": df95},
        "config_fetch_ms": {"p50": c50, "p95": c95, "direct_p50": dc50},
        "n": N, "n_stream": N_STREAM, "n_config": N_CONFIG})


if __name__ == "__main__":
    main()
