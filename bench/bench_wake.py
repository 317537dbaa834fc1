"""Scale to zero benchmark: wake from zero to the first reply, against two anchors measured in the same run.

Each sample: the instance is put to sleep (``provisioning.fleet.sleep.instance_sleep``: a clean stop, marked asleep),
then a message goes through the control plane (gunicorn, production config): 202, the wake task boots the
instance in a Celery worker, read-back, delivery; the clock stops at the reply stream's first chunk. Anchors:
the same message to an instance that is already running (send -> first chunk), and a plain start of a stopped
instance (``instance_start``: spawn, read-back, ready), the floor under any wake. Goal: wake p50 < 2 s. The
three alternate sample by sample, and which comes first alternates too: sleep, wake, running, stop, plain start;
then stop, plain start, running, sleep, wake. ``BENCH_WAKES`` (20).

Real parts: PostgreSQL, Redis as the broker (``BENCH_REDIS_URL``, default redis://127.0.0.1:6379/9), a Celery
worker, gunicorn, real agent-hosts running the conversational test agent (`tests.runtime.agents:AGENTS`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
from bench import _run, _setup  # noqa: E402
from bench._http import first_chunk, request  # noqa: E402
from bench._pg import free_port  # noqa: E402

N = _run.size("BENCH_WAKES", 20, smoke=2)
WARMUP = _run.size("BENCH_WAKE_WARMUP", 10, smoke=2)
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_POLL_INTERVAL_S": "0.05"}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _stack  # noqa: E402
from provisioning.choices import InstanceStatus, WakeOutcome  # noqa: E402
from provisioning.fleet.actions import instance_stop_planned  # noqa: E402
from provisioning.fleet.instances import instance_start  # noqa: E402
from provisioning.fleet.sleep import instance_sleep  # noqa: E402
from provisioning.models import AgentInstance, InstanceWake  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402

console = Console(width=140)


def _put_to_sleep(instance_pk: object) -> None:
    """Asleep once the previous reply's task has finished (a busy instance is never put to sleep)."""
    deadline = time.monotonic() + 60
    while True:
        outcome = instance_sleep(instance=AgentInstance.objects.get(pk=instance_pk), idle_s=0)
        if outcome == "asleep":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the instance would not fall asleep: {outcome}")
        time.sleep(0.1)


def main() -> None:
    call_command("migrate", verbosity=0)
    # Hosts this process starts (the plain-start anchor) are killed at the end, after the database is gone.
    settings.LOCAL_EXIT_NOTICE = False
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
        operator, token = _stack.operator_with_token("bench-wake")
        tenant = _stack.onboard(operator, "wake")
        instance_pk = AgentInstance.objects.get(tenant=tenant).pk
        tid = str(tenant.id)
        bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        _stack.wait_web(web_port, web)

        def send_to_first_chunk(expect_wake: bool) -> float:
            body = json.dumps({"content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, raw = request(web_port, "POST", f"/api/v1/tenants/{tid}/threads/w/messages", body,
                                  {**bearer, "Idempotency-Key": uuid.uuid4().hex})
            if status not in (201, 202) or (expect_wake and status != 202):
                raise RuntimeError(f"POST: {status} {raw[:300]!r}")
            first_chunk(web_port, f"/api/v1/tenants/{tid}/threads/w/messages/{json.loads(raw)['inbox']['id']}/reply",
                        bearer)
            return time.perf_counter() - t0

        wake_s: list[float] = []
        running_s: list[float] = []
        start_s: list[float] = []

        def wake() -> None:
            _put_to_sleep(instance_pk)
            wake_s.append(send_to_first_chunk(True))
            time.sleep(0.2)

        def running() -> None:
            running_s.append(send_to_first_chunk(False))
            time.sleep(0.3)  # the reply's task finishes before a planned stop or a sleep

        def plain_start() -> None:
            instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench: plain restart anchor")
            t0 = time.perf_counter()
            instance_start(tenant=tenant, actor=SYSTEM)
            start_s.append(time.perf_counter() - t0)

        for _ in range(WARMUP):  # warm the web workers' connections and the signing-key cache
            send_to_first_chunk(False)
        console.print(f"{N} wakes from zero, {N} messages to a running instance, {N} plain starts ...")
        for i in range(N):  # each order starts and ends with the instance running
            for sample in (wake, running, plain_start) if i % 2 == 0 else (plain_start, running, wake):
                sample()
            console.print(f"  {i + 1}/{N}: wake -> first chunk {wake_s[-1]:.2f} s, running {running_s[-1] * 1000:.0f}"
                          f" ms, plain start {start_s[-1]:.2f} s")
        wakes = list(InstanceWake.objects.filter(tenant=tenant, outcome=WakeOutcome.SUCCEEDED))
        boots = [w.boot_s for w in wakes if w.boot_s is not None]
        if len(wakes) != N or AgentInstance.objects.get(pk=instance_pk).status != InstanceStatus.RUNNING:
            raise RuntimeError(f"{len(wakes)} successful wakes recorded for {N} samples")
    w50, w95 = _setup.percentiles(wake_s)
    r50, r95 = _setup.percentiles(running_s)
    s50, s95 = _setup.percentiles(start_s)
    b50, b95 = _setup.percentiles(boots)
    table = Table(title="Scale to zero: wake from zero vs a running instance and a plain start (same run, alternating)")
    for col in ("measure", "p50", "p95", "against the anchor"):
        table.add_column(col)
    table.add_row(f"wake: send -> first reply chunk (n={N})", f"{w50 / 1000:.2f} s", f"{w95 / 1000:.2f} s",
                  f"goal p50 < 2 s; {w50 / s50:.2f}x a plain start, +{w50 - r50:.0f} ms over a running one")
    table.add_row("  of which accepted -> up and read back (InstanceWake)", f"{b50 / 1000:.2f} s",
                  f"{b95 / 1000:.2f} s", "what the dashboard shows")
    table.add_row(f"anchor: running instance, send -> first chunk (n={N})", f"{r50:.0f} ms", f"{r95:.0f} ms", "")
    table.add_row(f"anchor: plain start of a stopped instance (n={N})", f"{s50 / 1000:.2f} s",
                  f"{s95 / 1000:.2f} s", "instance_start: spawn, read-back, ready")
    console.print(table)
    _run.ratio_line("wake", "wake -> first chunk p50 / plain start p50", w50 / s50,
                    f"(plain start {s50 / 1000:.2f} s; goal wake p50 < 2 s)")
    _run.write_json("wake", {
        "wake_first_chunk_ms": {"p50": w50, "p95": w95}, "wake_boot_ms": {"p50": b50, "p95": b95},
        "running_first_chunk_ms": {"p50": r50, "p95": r95}, "plain_start_ms": {"p50": s50, "p95": s95},
        "n": N})


if __name__ == "__main__":
    main()
