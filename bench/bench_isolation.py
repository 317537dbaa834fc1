"""Isolation bench (issue 38): tenant B's HTTP latency while tenant A is OOM-killed over and over, against B alone.

Two tenants onboarded step by step on this machine, both instances real ``agent-host`` processes in their
sandboxes (own uid, own cgroup), on a small plan (160 MiB of memory, as tests/provisioning/test_isolation_limits.py).
The run alternates blocks (``BENCH_ISOLATION_ROUNDS`` pairs, 3; ``BENCH_ISOLATION_BLOCK_S`` seconds each, 15): B
alone and B while A's loop runs, who goes first alternating between pairs. Throughout, the bench's main thread asks B's
host ``GET /readyz`` at the port the control plane verified B publishes (``local_process.published_port``), one request
after the other with 20 ms between them: that is B's latency. A's loop (a second thread, waiting on subprocesses
almost all the time) does, again and again: mark A's host first in line for the OOM killer (``oom_score_adj``
1000, as a leaking host would be), run a 256 MiB allocation as A's instance (``instance_command``: A's cgroup,
sandbox and uid), which the kernel kills at the plan's memory together with A's host, and restart A's host with
``driver.ensure`` (the recovery's restart step).

The anchor is B alone in the same run. Figures: B's p50/p99 in each phase, A's OOM kills (the cgroup's own
``oom_kill`` count) and restarts, the load average before and after. Needs root and bubblewrap (the sandbox and
cgroups); elsewhere it prints why and a ratio of n/a.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from provisioning.drivers.local_limits import oom_kills  # noqa: E402
from provisioning.drivers.local_process import (  # noqa: E402
    LocalProcessDriver,
    instance_command,
    live_host_pid,
    published_port,
    volume_host_dir,
)
from provisioning.drivers.local_sandbox import sandbox_support  # noqa: E402
from provisioning.resources.spec import tenant_spec  # noqa: E402
from provisioning.workflows.onboarding import tenant_onboard  # noqa: E402
from provisioning.workflows.steps import (  # noqa: E402
    StepContext,
    step_database,
    step_objectstore,
    step_runtime,
    step_vault,
    step_volume,
)
from tenants.actors import SYSTEM  # noqa: E402
from tenants.services import operator_create  # noqa: E402

ROUNDS = _run.size("BENCH_ISOLATION_ROUNDS", 3, 1)
BLOCK_S = _run.seconds("BENCH_ISOLATION_BLOCK_S", 15.0, 2.0)
GAP_S = 0.02
SECRETS = ("db_password", "object_key_b64", "instance_token")
ALLOCATE = r'''
chunks = []
for i in range(16):  # 256 MiB in 16 MiB steps, every page touched: past the plan's 160 MiB
    chunks.append(bytearray(16 * 2**20))
'''


def _spec(tenant: Any) -> Any:
    return tenant_spec(tenant, with_secrets=SECRETS)


def _onboard(operator: Any, slug: str) -> Any:
    tenant, _ = tenant_onboard(operator=operator, slug=slug, name=slug, actor=SYSTEM, allow_no_release=True)
    ctx = StepContext(tenant)
    for step in (step_database, step_volume, step_objectstore, step_vault, step_runtime):
        step(ctx)
    return tenant


def _b_url(spec: Any) -> str:
    host_dir = volume_host_dir(spec.resources["volume"].details["path"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        port = published_port(host_dir, spec.tenant_id)
        if port:
            return f"http://127.0.0.1:{port}/readyz"
        time.sleep(0.2)
    raise RuntimeError("B published no port")


def _sample(url: str, seconds: float) -> tuple[list[float], int]:
    """B's latencies over ``seconds`` (one request at a time) and how many failed."""
    samples, errors = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback, our own instance
                resp.read()
            samples.append(time.perf_counter() - start)
        except OSError:
            errors += 1
        time.sleep(GAP_S)
    return samples, errors


class OomLoop(threading.Thread):
    """A's host killed at its memory limit and restarted, until told to stop."""

    def __init__(self, spec: Any) -> None:
        super().__init__(daemon=True)
        self.spec, self.halt = spec, threading.Event()
        self.rounds = self.restarts = 0
        self.restart_s: list[float] = []

    def run(self) -> None:
        driver = LocalProcessDriver()
        while not self.halt.is_set():
            host = live_host_pid(self.spec)
            if host:
                Path(f"/proc/{host}/oom_score_adj").write_text("1000")
            argv, env = instance_command(self.spec, [sys.executable, "-c", ALLOCATE])
            subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
            self.rounds += 1
            if live_host_pid(self.spec) is None:
                start = time.perf_counter()
                driver.ensure(self.spec)
                self.restart_s.append(time.perf_counter() - start)
                self.restarts += 1


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000 if ordered else float("nan")


def main() -> None:
    ok, why = sandbox_support()
    if not ok:
        print(f"bench_isolation: skipped, this machine cannot sandbox instances: {why}")
        _run.ratio_line("isolation", "B p99 during A's OOM loop / B alone", float("nan"), "(no sandbox here)")
        return
    call_command("migrate", verbosity=0)
    settings.KUBERNETES_PLANS = {**settings.KUBERNETES_PLANS, "standard": {
        **settings.KUBERNETES_PLANS["standard"], "memory_limit": "160Mi", "pids": "64", "cpu_limit": "1000m"}}
    operator = operator_create(slug=f"iso-{_setup.RUN_ID}", name="Isolation bench", actor=SYSTEM)
    a, b = _onboard(operator, "oom-a"), _onboard(operator, "steady-b")
    spec_a, spec_b = _spec(a), _spec(b)
    url = _b_url(spec_b)
    kills_before, load_before = oom_kills(spec_a.resource_name) or 0, os.getloadavg()
    alone: list[float] = []
    during: list[float] = []
    errors = {"alone": 0, "during": 0}
    loops: list[OomLoop] = []
    try:
        for block in range(2 * ROUNDS):  # alone, during; during, alone; ...: who goes first alternates
            if (block % 2 == 0) == (block // 2 % 2 == 0):
                got, failed = _sample(url, BLOCK_S)
                alone += got
                errors["alone"] += failed
                continue
            loop = OomLoop(spec_a)
            loops.append(loop)
            loop.start()
            got, failed = _sample(url, BLOCK_S)
            during += got
            errors["during"] += failed
            loop.halt.set()
            loop.join(180)
            if live_host_pid(spec_a) is None:
                LocalProcessDriver().ensure(spec_a)
    finally:
        for tenant in (a, b):
            LocalProcessDriver().stop(_spec(tenant), grace_s=10)
    load_after = os.getloadavg()
    kills = (oom_kills(spec_a.resource_name) or 0) - kills_before
    restart = sorted(s for loop in loops for s in loop.restart_s)
    figures: dict[str, Any] = {
        "rounds": ROUNDS, "block_s": BLOCK_S, "plan_memory": "160Mi",
        "b_alone": {"n": len(alone), "p50_ms": _pct(alone, 0.5), "p99_ms": _pct(alone, 0.99),
                    "max_ms": max(alone) * 1000 if alone else None, "errors": errors["alone"]},
        "b_during_a_oom": {"n": len(during), "p50_ms": _pct(during, 0.5), "p99_ms": _pct(during, 0.99),
                           "max_ms": max(during) * 1000 if during else None, "errors": errors["during"]},
        "a_allocations": sum(loop.rounds for loop in loops), "a_oom_kills": kills,
        "a_restarts": sum(loop.restarts for loop in loops),
        "a_restart_p50_s": restart[len(restart) // 2] if restart else None,
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    for phase in ("b_alone", "b_during_a_oom"):
        f = figures[phase]
        print(f"{phase:>16}: n={f['n']} p50={f['p50_ms']:.2f} ms p99={f['p99_ms']:.2f} ms "
              f"max={f['max_ms']:.1f} ms errors={f['errors']}")
    print(f"A: {figures['a_allocations']} allocations, {kills} OOM kills, {figures['a_restarts']} host restarts "
          f"(p50 {figures['a_restart_p50_s'] or 0:.2f} s); load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f}")
    _run.write_json("isolation", figures)
    ratio = figures["b_during_a_oom"]["p99_ms"] / figures["b_alone"]["p99_ms"]
    _run.ratio_line("isolation", "B p99 during A's OOM loop / B alone", ratio, "(B alone)")


if __name__ == "__main__":
    main()
