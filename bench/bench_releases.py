"""Release rollout benchmark: roll a release across 100 live local instances in waves of 10, each instance
running a task the whole time, and the per-tenant downtime (last step finished on the old release -> first
step finished on the new one), p50/p95.

Anchor, measured in the same run on the same kind of instance: the downtime of a plain restart (graceful stop
and start on the same release, what a rolling restart does), so the ratio says what the release switch and its
checks cost on top of the restart itself. The anchor's instances are ``BENCH_RELEASE_ANCHORS`` (10) more tenants,
pinned to the old release so the rollout leaves them alone; one of them is restarted each time the rollout has
upgraded a wave (during that wave's soak, when the rollout restarts nothing), so anchor and waves alternate. The
rollout runs the product's own workflow (``rollout_execute``: canary, health gate with its soak, waves) in this
process; onboarding runs the real workflow with real instance boots. Instances hold two PostgreSQL sessions each
(issue 16), more than the machine's server allows for 110 of them, so the run starts its own PostgreSQL 15
(``max_connections = 500``) and removes it after.

``BENCH_RELEASE_TENANTS`` (100), ``BENCH_RELEASE_WAVE`` (10), ``BENCH_RELEASE_SOAK_S`` (5),
``BENCH_RELEASE_STEP_S`` (1.0: each instance's task finishes a step every second).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _pg, _run  # noqa: E402

N = _run.size("BENCH_RELEASE_TENANTS", 100, smoke=2)
WAVE = _run.size("BENCH_RELEASE_WAVE", 10, smoke=1)
SOAK_S = _run.size("BENCH_RELEASE_SOAK_S", 5, smoke=1)
STEP_S = _run.seconds("BENCH_RELEASE_STEP_S", 1.0, smoke=0.5)
ANCHOR_N = _run.size("BENCH_RELEASE_ANCHORS", 10, smoke=1)


PG_BASE, PG_URL = _pg.start("releases", options="-c max_connections=500 -c shared_buffers=256MB -c fsync=on")
atexit.register(_pg.stop, PG_BASE)  # registered before _setup's clean-up, so it runs after it (last in, first out)
os.environ["BENCH_POSTGRES_URL"] = PG_URL
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""  # real local instances
# No exit notice in this process, the instances' parent: the end's stop would read as deaths and start recoveries.
os.environ["LOCAL_EXIT_NOTICE"] = "false"
os.environ.setdefault("RELEASE_GATE_POLL_S", "1")
from bench import _setup  # noqa: E402  (environment first)

os.environ["INSTANCE_EXTRA_ENV"] = "AGENT_HEARTBEAT_INTERVAL_S=5"
import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.utils import timezone  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.choices import ResourceKind  # noqa: E402
from provisioning.drivers.registry import driver_for  # noqa: E402
from provisioning.fleet.actions import instance_stop_planned  # noqa: E402
from provisioning.fleet.instances import instance_start, instance_submit_task  # noqa: E402
from provisioning.models import WorkflowRun  # noqa: E402
from provisioning.resources.spec import tenant_spec  # noqa: E402
from provisioning.workflows.engine import workflow_execute  # noqa: E402
from provisioning.workflows.onboarding import tenant_onboard  # noqa: E402
from releases.assignments import release_default_set, step_downtime_ms, tenant_release_pin  # noqa: E402
from releases.choices import ItemStatus, RolloutStatus  # noqa: E402
from releases.models import RolloutItem  # noqa: E402
from releases.rollouts import rollout_create, rollout_execute  # noqa: E402
from releases.services import release_create  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402
from tests.releases.test_releases_upload import make_wheel  # noqa: E402

console = Console(width=140)
TICKER = '''
import time

from agent_runtime.sdk import Step


class Ticker:
    """A long task of one-second steps: the instance is always mid-task when the rollout reaches it."""

    kind = "ticker"
    description = "ticks ({version})"

    def steps(self, params):
        return [Step(f"tick_{{i}}", self.tick) for i in range(int(params.get("ticks", 10)))]

    def tick(self, ctx):
        time.sleep(float(ctx.params.get("step_s", 1.0)))
        return {{"version": {version!r}}}


agent = Ticker()
'''


def _release(operator, version: str):  # type: ignore[no-untyped-def]
    filename, data = make_wheel("ticker-agent", version, module=TICKER.format(version=version),
                                entry_points="[agent_runtime.agents]\nticker = ticker_agent:agent\n")
    return release_create(operator=operator, filename=filename, data=data, actor=SYSTEM)


def _pool(fn, items, workers: int = 4) -> list:  # type: ignore[no-untyped-def, type-arg]
    def run(item):  # type: ignore[no-untyped-def]
        close_old_connections()
        try:
            return fn(item)
        finally:
            close_old_connections()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, items))


def onboard(operator, n: int) -> list[Tenant]:  # type: ignore[no-untyped-def]
    def one(i: int) -> Tenant:
        tenant, _ = tenant_onboard(operator=operator, slug=f"rel-{i:03d}", name=f"Release {i}",
                                   actor=SYSTEM, allow_no_release=True)
        outcome = workflow_execute(str(WorkflowRun.objects.get(tenant=tenant).pk))
        if outcome != "succeeded":
            raise RuntimeError(f"onboarding {tenant.slug}: {outcome}")
        return tenant

    return _pool(one, range(n))


def _item_downtime(item: RolloutItem) -> float | None:
    """An item's downtime as the rollout recorded it or, when its first step on the new release finished after
    the rollout's gate stopped looking (a loaded machine), measured the same way now, waiting as the anchor does."""
    if item.downtime_ms is not None:
        return item.downtime_ms / 1000
    return None if item.stopped_at is None else _downtime_after(item.tenant, item.stopped_at)


def _downtime_after(tenant: Tenant, stopped: datetime) -> float | None:
    """Seconds from the tenant's last step done before ``stopped`` to its first after, once there is one (30 s)."""
    deadline = time.monotonic() + 30
    downtime = step_downtime_ms(tenant, stopped=stopped)
    while downtime is None and time.monotonic() < deadline:
        time.sleep(0.2)
        downtime = step_downtime_ms(tenant, stopped=stopped)
    return None if downtime is None else downtime / 1000


def plain_restart_downtime(tenant: Tenant) -> float | None:
    """The anchor: a graceful stop and start on the same release (what a rolling restart does to each
    instance), measured the way the rollout measures its own: steps finished around the stop."""
    instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench: plain restart")
    stopped = timezone.now()
    instance_start(tenant=tenant, actor=SYSTEM)
    return _downtime_after(tenant, stopped)


class AnchorBetweenWaves:
    """A thread that restarts one anchor tenant (in turn) each time the rollout has finished upgrading a wave, so
    the anchor's samples alternate with the rollout's waves instead of all coming before or after them."""

    def __init__(self, rollout_id: object, anchors: list[Tenant]) -> None:
        self.rollout_id, self.anchors = rollout_id, anchors
        self.downtimes: list[float] = []
        self.restarts = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="anchor-restarts", daemon=True)
        self.thread.start()

    def _waves_upgraded(self) -> int:
        open_waves = set(RolloutItem.objects.filter(
            rollout_id=self.rollout_id, status__in=(ItemStatus.PENDING, ItemStatus.UPGRADING)
        ).values_list("wave", flat=True))
        waves = set(RolloutItem.objects.filter(rollout_id=self.rollout_id).values_list("wave", flat=True))
        return len([w for w in waves if w not in open_waves and all(o > w for o in open_waves)])

    def _run(self) -> None:
        close_old_connections()
        try:
            done = 0
            while not self.stop.is_set():
                upgraded = self._waves_upgraded()
                if upgraded > done:
                    done = upgraded
                    downtime = plain_restart_downtime(self.anchors[self.restarts % len(self.anchors)])
                    self.restarts += 1
                    if downtime is not None:
                        self.downtimes.append(downtime)
                self.stop.wait(0.2)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread by finish()
            self.error = exc
        finally:
            close_old_connections()

    def finish(self) -> list[float]:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise RuntimeError("an anchor restart failed") from self.error
        return self.downtimes


def stop_all(tenants: list[Tenant]) -> None:
    driver = driver_for(ResourceKind.RUNTIME)
    _pool(lambda t: driver.stop(tenant_spec(t), grace_s=2), tenants, workers=8)


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-releases", name="Bench releases", actor=SYSTEM)
    operator.tenant_quota = N + ANCHOR_N + 10
    operator.save()
    old, new = _release(operator, "1.0.0"), _release(operator, "2.0.0")
    release_default_set(operator=operator, release_id=old.pk, actor=SYSTEM)
    console.print(f"PostgreSQL 15 (private, max_connections 500) {PG_URL.rsplit('@', 1)[-1]}; {N} tenants rolled out, "
                  f"{ANCHOR_N} anchor tenants")
    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instances", _setup.stop_hosts)
        start = time.perf_counter()
        everyone = onboard(operator, N + ANCHOR_N)
        onboard_s = time.perf_counter() - start
        cleanup.add("stop the instances gracefully", stop_all, everyone)
        console.print(f"onboarded {N + ANCHOR_N} live instances on release 1.0.0 in {onboard_s:.0f} s")
        everyone = list(Tenant.objects.filter(pk__in=[t.pk for t in everyone]).order_by("created_at", "id"))
        anchors = everyone[-ANCHOR_N:]
        for tenant in anchors:  # the rollout leaves pinned tenants alone; the same release: no restart now
            tenant_release_pin(tenant=tenant, release_id=old.pk, pinned=True, actor=SYSTEM)
        ticks = int(3600 / STEP_S)
        _pool(lambda t: instance_submit_task(tenant=t, kind="ticker", params={"ticks": ticks, "step_s": STEP_S},
                                             actor=SYSTEM), everyone)
        time.sleep(3 * STEP_S + 2)  # every task under way
        rollout = rollout_create(operator=operator, release_id=new.pk, actor=SYSTEM, canary=WAVE, wave_size=WAVE,
                                 soak_s=SOAK_S)
        anchor_restarts = AnchorBetweenWaves(rollout.pk, anchors)
        try:
            start = time.perf_counter()
            status = rollout_execute(str(rollout.pk))
            rollout_s = time.perf_counter() - start
        finally:
            time.sleep(3 * STEP_S)  # the restart the last wave set off finishes before the thread is told to stop
            anchor = anchor_restarts.finish()
        items = list(RolloutItem.objects.filter(rollout=rollout).select_related("tenant"))
    downtimes = [d for d in (_item_downtime(i) for i in items) if d is not None]
    upgraded = sum(1 for i in items if i.status == "upgraded")
    twice = sum(1 for i in items if i.upgrades > 1)
    a50, a95 = _setup.percentiles(anchor) if anchor else (float("nan"), float("nan"))
    d50, d95 = _setup.percentiles(downtimes) if downtimes else (float("nan"), float("nan"))
    waves = 1 + max((i.wave for i in items), default=0)

    table = Table(title=f"Release rollout: {N} live local instances, waves of {WAVE}, soak {SOAK_S} s")
    for col in ("measure", "p50 / total", "p95", "ratio / note"):
        table.add_column(col)
    table.add_row(f"anchor: plain graceful restart downtime (n={len(anchor)}, one per wave, between waves)",
                  f"{a50:.0f} ms", f"{a95:.0f} ms", "anchor")
    table.add_row(f"rollout downtime per tenant (n={len(downtimes)})", f"{d50:.0f} ms", f"{d95:.0f} ms",
                  f"{d50 / a50:.2f}x anchor" if anchor and downtimes else "")
    table.add_row(f"rollout of {N} tenants ({waves} waves, status {status})", f"{rollout_s:.0f} s", "",
                  f"{rollout_s - waves * SOAK_S:.0f} s without the soaks; {upgraded} upgraded, {twice} twice")
    table.add_row(f"onboarding with instance boot (4 threads, {N + ANCHOR_N} tenants)", f"{onboard_s:.0f} s", "",
                  f"{(N + ANCHOR_N) / onboard_s:.2f}/s")
    console.print(table)
    if status != RolloutStatus.SUCCEEDED or not anchor or not downtimes:
        raise SystemExit(f"rollout {status}; {len(downtimes)} rollout and {len(anchor)} anchor downtimes measured")
    _run.ratio_line("releases", "downtime per tenant p50, rollout / plain restart", d50 / a50,
                    f"(plain restart {a50:.0f} ms)")
    out = {"tenants": N, "anchors": ANCHOR_N, "wave": WAVE, "soak_s": SOAK_S, "status": status,
           "rollout_s": rollout_s, "waves": waves, "upgraded": upgraded, "upgraded_twice": twice,
           "downtime_p50_ms": d50, "downtime_p95_ms": d95, "anchor_restart_p50_ms": a50,
           "anchor_restart_p95_ms": a95, "anchor_n": len(anchor), "onboard_s": onboard_s}
    _run.write_json("releases", out)


if __name__ == "__main__":
    main()
