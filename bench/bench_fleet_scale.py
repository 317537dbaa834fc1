"""Fleet benchmark (issue 16): 10,000 tenants provisioned with the instance boot deferred, then the fleet jobs.

What it does, in one run on a private database (``bench/_setup.py``: ``cp_bench_<id>``, its roles dropped at
the end) and a Redis database for the broker and the heartbeats (``BENCH_REDIS_URL``, default db 10):

1. onboards ``--anchor`` tenants (1,000 by default), then the rest up to ``--tenants`` (10,000), each through
   ``tenant_onboard`` and the real onboarding workflow on ``--workers`` real Celery worker processes (solo pool),
   with ``PROVISIONING_RUNTIME_DRIVER=deferred`` (every resource is made; the agent-host process is not started);
2. after each stage, with the fleet's instances marked running (as if booted; a deferred instance is
   ``pending``, which no fleet job looks at) and a heartbeat in Redis for every one, ``--stale`` of them long
   silent: times detection alone and ONE ``recovery_sweep`` (which dispatches the stale ones), ONE full
   ``drift_check`` cycle (runs of 500 until every instance was observed), and the backup job's batch
   (``backup_batch``) with the measured time of one real ``schema_archive``, to say whether the 6-hour interval
   holds at that size.

The stage at ``--anchor`` is the anchor: the ratios show how each job scales from 1,000 to 10,000. It is measured
before the larger fleet by necessity (the fleet only grows; a fleet of 1,000 cannot be measured after 10,000
without deprovisioning 9,000), so this is the one bench whose anchor comes first. Develop with ``--tenants 500``
(anchor 50); the full run loads the shared machine for ~30 minutes (27 min on 2026-12-02).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _run  # noqa: E402

_parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
_parser.add_argument("--tenants", type=int, default=_run.size("BENCH_FLEET_TENANTS", 10_000, smoke=8),
                     help="fleet size at the end (default 10,000)")
_parser.add_argument("--anchor", type=int, default=_run.size("BENCH_FLEET_ANCHOR", 0, smoke=3),
                     help="fleet size of the anchor stage (default: 1,000, "
                     "or a tenth of --tenants when that is smaller)")
_parser.add_argument("--workers", type=int, default=2, help="Celery worker processes for onboarding (default 2)")
_parser.add_argument("--stale", type=int, default=_run.size("BENCH_FLEET_STALE", 10, smoke=1),
                     help="instances with a long-silent heartbeat per stage")
_parser.add_argument("--dump-sample", type=int, default=_run.size("BENCH_FLEET_DUMP_SAMPLE", 8, smoke=1),
                     help="schemas archived to time one backup")
_parser.add_argument("--budget-min", type=float, default=0, help="stop onboarding the second stage this many "
                     "minutes after the run started and measure the fleet at the size it reached (default: none)")
ARGS = _parser.parse_args()
ANCHOR = ARGS.anchor or min(1000, max(1, ARGS.tenants // 10))

os.environ["CELERY_BROKER_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
os.environ["PROVISIONING_RUNTIME_DRIVER"] = "deferred"
# No sandbox user per tenant: 10,000 machine-wide Unix users would outlive the run, and other sessions' test
# clean-up removes users it did not see before it started (tests/conftest.py), so they would vanish mid-run.
os.environ["LOCAL_INSTANCE_ISOLATION"] = "off"
import django  # noqa: E402

from bench import _setup  # noqa: E402  (environment first)

django.setup()

import psycopg  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_runtime.state import migrations as runtime_migrations  # noqa: E402
from bench import _stack  # noqa: E402
from provisioning.choices import InstanceStatus  # noqa: E402
from provisioning.databases.archives import schema_archive, schema_dump  # noqa: E402
from provisioning.databases.backups import backup_batch  # noqa: E402
from provisioning.databases.servers import database_server_update, settings_server_ensure  # noqa: E402
from provisioning.drivers.pg_admin import admin_conninfo  # noqa: E402
from provisioning.models import AgentInstance  # noqa: E402
from provisioning.recovery.heartbeats import heartbeat_store  # noqa: E402
from provisioning.recovery.sweep import drift_check, recovery_candidates, recovery_sweep  # noqa: E402
from provisioning.workflows.onboarding import tenant_onboard  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402

console = Console(width=150)
QUEUE = os.environ["CELERY_TASK_DEFAULT_QUEUE"]
BACKUP_RUN_EVERY_S = 600.0  # the backup job's default beat interval (provisioning/databases/backups.py)
DRIFT_LIMIT = 500  # drift_check's default run size
WORKERS_UP_S = _run.seconds("BENCH_WORKERS_UP_S", 4.0, smoke=1.0)


def onboard_stage(operator, start: int, end: int, deadline: float) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Onboard tenants ``start``..``end-1`` on real workers: (seconds from the first submit to the last ready, how
    many are ready). Past ``deadline`` (monotonic) the stage stops where it is; the rest stay unonboarded."""
    with open(_setup.TMP / "workers.log", "ab") as log:
        workers = [_stack.worker(name=f"fleet{i}", stderr=log) for i in range(ARGS.workers)]
    try:
        time.sleep(WORKERS_UP_S)  # the workers are up before the clock starts
        ours = Tenant.objects.filter(created_at__gte=timezone.now())
        began = time.perf_counter()
        for i in range(start, end):
            tenant_onboard(allow_no_release=True, operator=operator, slug=f"fleet-{i}", name=f"Fleet {i}", actor=SYSTEM)
        console.print(f"  submitted {end - start} onboardings in {time.perf_counter() - began:.1f} s")
        last_print = 0.0
        while True:
            ready = ours.filter(status="ready").count()
            failed = ours.filter(status="failed").first()
            if failed is not None:
                raise RuntimeError(f"onboarding of {failed.slug} failed: {failed.status_reason}")
            elapsed = time.perf_counter() - began
            if ready >= end - start:
                return elapsed, ready
            if time.monotonic() > deadline:
                console.print(f"  [yellow]time budget spent: {ready} of {end - start} ready after {elapsed:.0f} s; "
                              "measuring the fleet at this size[/yellow]")
                return elapsed, ready
            if elapsed - last_print >= 60:
                console.print(f"  {ready}/{end - start} ready after {elapsed:.0f} s")
                last_print = elapsed
            time.sleep(1)
    finally:
        _stack.stop(workers)
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(QUEUE)  # nothing of this stage left queued


def fleet_running(stale: int) -> tuple[list[str], float]:
    """Mark every deferred instance running and give every running one a fresh heartbeat; ``stale`` of them (at
    most half the fleet: the drift check needs instances the sweep left running), never stale before, a heartbeat
    an hour old. Returns the stale instances' ids and the heartbeats' time."""
    AgentInstance.objects.filter(status=InstanceStatus.PENDING, tenant__status="ready").update(
        status=InstanceStatus.RUNNING)
    store = heartbeat_store()
    now = time.time()
    ids = [str(pk) for pk in AgentInstance.objects.filter(status=InstanceStatus.RUNNING)
           .order_by("-created_at").values_list("pk", flat=True)]  # the newest: never made stale before
    chosen = set(ids[:min(stale, len(ids) // 2)])
    for instance_id in ids:
        store.record(instance_id, {"status": "idle", "progress_seq": 1},
                     now=now - 3600 if instance_id in chosen else now)
    return sorted(chosen), now


def measure_sweep(stale_ids: list[str], beat_at: float) -> dict[str, float]:
    """Detection alone (best of 3), then one whole sweep, as of the heartbeats' time: writing 10,000 heartbeats on
    a loaded machine can take longer than the heartbeat timeout, which would make the first ones look silent."""
    detect = []
    for _ in range(3):
        began = time.perf_counter()
        found = recovery_candidates(now=beat_at + 1)
        detect.append(time.perf_counter() - began)
    assert sorted(str(i.pk) for i, _, _ in found) == stale_ids, (len(found), len(stale_ids))
    began = time.perf_counter()
    result = recovery_sweep(now=beat_at + 1)
    sweep_s = time.perf_counter() - began
    assert result.ran and sorted(result.dispatched) == stale_ids, result
    return {"detect_ms": min(detect) * 1000, "sweep_ms": sweep_s * 1000, "dispatched": len(result.dispatched)}


def measure_drift() -> dict[str, float]:
    """One full cycle: drift_check runs of 500 until every sweepable instance was observed once."""
    eligible = AgentInstance.objects.filter(status=InstanceStatus.RUNNING, tenant__status__in=("ready", "degraded"))
    n = eligible.count()
    cycle_start = timezone.now()
    runs = []
    dispatched = 0
    for _ in range(math.ceil(n / DRIFT_LIMIT)):
        began = time.perf_counter()
        dispatched += len(drift_check(limit=DRIFT_LIMIT))
        runs.append(time.perf_counter() - began)
    covered = eligible.filter(drift_checked_at__gte=cycle_start).count()
    assert covered == n, f"one cycle observed {covered} of {n}"
    return {"instances": n, "runs": len(runs), "run_p50_s": statistics.median(runs), "run_max_s": max(runs),
            "cycle_s": sum(runs), "dispatched": dispatched, "per_instance_ms": sum(runs) / n * 1000}


def measure_backups(sample: int) -> dict[str, float]:
    """This run's batch at the default 10-minute beat interval, and the measured cost of archiving a schema."""
    began = time.perf_counter()
    batch = backup_batch(run_every_s=BACKUP_RUN_EVERY_S)
    select_ms = (time.perf_counter() - began) * 1000
    tenants = list(Tenant.objects.filter(pk__in=batch[:sample]))
    # A booted instance has the runtime's tables in its schema; a deferred one not yet. Dump what a live one has.
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        for tenant in tenants:
            runtime_migrations.migrate(conn, tenant.resource_name)
    dumps, archives = [], []
    for tenant in tenants:
        began = time.perf_counter()
        schema_dump(tenant)
        dumps.append(time.perf_counter() - began)
        began = time.perf_counter()
        schema_archive(tenant=tenant, label="backup")
        archives.append(time.perf_counter() - began)
    per_schema = statistics.median(archives)
    interval = settings.SCHEMA_BACKUP_INTERVAL_S
    return {"batch": len(batch), "select_ms": select_ms, "dump_p50_s": statistics.median(dumps),
            "archive_p50_s": per_schema, "run_s": len(batch) * per_schema,
            "run_share": len(batch) * per_schema / BACKUP_RUN_EVERY_S,
            # the fleet this per-schema time can keep within the interval, one run after another without a gap
            "max_fleet": interval / (per_schema * 1.25), "old_cap_fleet": 100 * interval / BACKUP_RUN_EVERY_S}


def stage(operator, start: int, end: int, deadline: float) -> dict[str, object]:  # type: ignore[no-untyped-def]
    console.print(f"[bold]stage: onboard tenants {start}..{end - 1} on {ARGS.workers} workers[/bold]")
    onboard_s, onboarded = onboard_stage(operator, start, end, deadline)
    console.print(f"  onboarded {onboarded} in {onboard_s:.1f} s ({onboarded / onboard_s:.1f} tenants/s)")
    stale_ids, beat_at = fleet_running(ARGS.stale)
    sweep = measure_sweep(stale_ids, beat_at)
    console.print(f"  sweep: {sweep}")
    drift = measure_drift()
    console.print(f"  drift: {drift}")
    backups = measure_backups(ARGS.dump_sample)
    console.print(f"  backups: {backups}")
    # The sweep's recoveries stay queued, undone: the next stage's onboarding is timed without them.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(QUEUE)
    fleet = Tenant.objects.filter(status__in=("ready", "recovering")).count()
    return {"fleet": fleet, "onboarded": onboarded, "onboard_s": onboard_s, "onboard_per_s": onboarded / onboard_s,
            "sweep": sweep, "drift": drift, "backups": backups}


def report(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    table = Table(title=f"Fleet jobs at {a['fleet']:,} and {b['fleet']:,} tenants (instance boot deferred)")
    for col in ("measure", f"{a['fleet']:,} (anchor)", f"{b['fleet']:,}", f"ratio ({b['fleet'] / a['fleet']:.0f}x "
                "fleet)"):
        table.add_column(col)

    def row(label: str, x: float, y: float, fmt: str) -> None:
        table.add_row(label, format(x, fmt), format(y, fmt), f"{y / x:.2f}x" if x else "")

    row(f"onboarding throughput, tenants/s ({ARGS.workers} workers; stage of {a['onboarded']:,} / "
        f"{b['onboarded']:,})", a["onboard_per_s"], b["onboard_per_s"], ".1f")
    row("onboarding stage, s", a["onboard_s"], b["onboard_s"], ".1f")
    stale = f"{a['sweep']['dispatched']:.0f} / {b['sweep']['dispatched']:.0f} stale"
    row(f"sweep detection only, ms ({stale})", a["sweep"]["detect_ms"], b["sweep"]["detect_ms"], ".1f")
    row("one recovery_sweep incl. dispatching them, ms", a["sweep"]["sweep_ms"], b["sweep"]["sweep_ms"], ".1f")
    row(f"drift: runs of {DRIFT_LIMIT} to cover the fleet", a["drift"]["runs"], b["drift"]["runs"], ".0f")
    row("drift: one run, p50 s", a["drift"]["run_p50_s"], b["drift"]["run_p50_s"], ".2f")
    row("drift: per instance, ms", a["drift"]["per_instance_ms"], b["drift"]["per_instance_ms"], ".2f")
    row("drift: one full cycle, s", a["drift"]["cycle_s"], b["drift"]["cycle_s"], ".1f")
    row("backups: batch per 10-min run", a["backups"]["batch"], b["backups"]["batch"], ".0f")
    row("backups: batch selection, ms", a["backups"]["select_ms"], b["backups"]["select_ms"], ".1f")
    row("backups: pg_dump of one schema, p50 s", a["backups"]["dump_p50_s"], b["backups"]["dump_p50_s"], ".3f")
    row("backups: schema_archive of one schema, p50 s", a["backups"]["archive_p50_s"], b["backups"]["archive_p50_s"],
        ".3f")
    row("backups: one run's work, s (of 600 s)", a["backups"]["run_s"], b["backups"]["run_s"], ".1f")
    row("backups: fleet the 6-h interval holds for at this dump time", a["backups"]["max_fleet"],
        b["backups"]["max_fleet"], ",.0f")
    console.print(table)
    holds = b["backups"]["run_s"] <= BACKUP_RUN_EVERY_S
    console.print(f"6-hour backup interval at {b['fleet']:,}: {'holds' if holds else 'does NOT hold'} "
                  f"({b['backups']['run_share']:.0%} of each 10-minute run; the old fixed 100 per run capped the "
                  f"fleet at {b['backups']['old_cap_fleet']:,.0f})")
    scale = f"(fleet of {b['fleet']:,} / anchor fleet of {a['fleet']:,}, measured first)"
    _run.ratio_line("fleet_scale", "onboarding throughput", b["onboard_per_s"] / a["onboard_per_s"], scale)
    _run.ratio_line("fleet_scale", "drift per instance observed", b["drift"]["per_instance_ms"]
                    / a["drift"]["per_instance_ms"], scale)
    _run.ratio_line("fleet_scale", "one recovery_sweep", b["sweep"]["sweep_ms"] / a["sweep"]["sweep_ms"], scale)


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="fleet-ops", name="Fleet bench", actor=SYSTEM)
    operator.tenant_quota = ARGS.tenants + 10
    operator.save()
    # The server record before the workers start (two workers making it at once made two records for the one
    # server), with room for the whole fleet: a server takes 1,000 tenants unless told otherwise.
    database_server_update(name=settings_server_ensure().name, capacity=ARGS.tenants + 10, actor=SYSTEM)
    console.print(f"PostgreSQL {_setup.SERVER_URL.rsplit('@', 1)[-1]}, database {_setup.DB_NAME}; broker and "
                  f"heartbeats {settings.CELERY_BROKER_URL}; {ARGS.tenants:,} tenants, anchor {ANCHOR:,}")
    started = time.monotonic()  # this run's heartbeats and queue are removed from Redis at exit (bench/_setup.py)
    first = stage(operator, 0, ANCHOR, deadline=float("inf"))  # the anchor is always complete
    second = stage(operator, ANCHOR, ARGS.tenants,
                   deadline=started + ARGS.budget_min * 60 if ARGS.budget_min else float("inf"))
    report(first, second)
    _run.write_json("fleet_scale", {"workers": ARGS.workers, "stale": ARGS.stale,
                                                          "anchor": first, "fleet": second})


if __name__ == "__main__":
    main()
