"""Onboarding benchmark on real PostgreSQL: the control plane's work per tenant, against a floor.

Floor (anchor, measured in the same run, alternating sample by sample with ours, who goes first alternating too):
one transaction creating a role, a schema and six small tables. Ours: ``tenant_onboard`` + the whole onboarding
workflow (database, volume, object store, vault keys, runtime record, ready) with the instance boot deferred.
Then 1,000 tenants onboarded by two real Celery workers, and the check that 1,000 tenant schemas are at the
runtime's current schema version. ``BENCH_ONBOARD_N`` (200), ``BENCH_BULK_N`` (1,000).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402  (environment first)

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from psycopg import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_runtime.state import migrations as runtime_migrations  # noqa: E402
from bench import _stack  # noqa: E402
from provisioning.drivers.pg_admin import admin_conninfo  # noqa: E402
from provisioning.models import WorkflowRun  # noqa: E402
from provisioning.workflows.engine import workflow_execute  # noqa: E402
from provisioning.workflows.onboarding import tenant_onboard  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.choices import TenantStatus  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402

console = Console(width=140)
N_LATENCY = _run.size("BENCH_ONBOARD_N", 200, smoke=4)
N_BULK = _run.size("BENCH_BULK_N", 1000, smoke=4)


def floor_once(conn: psycopg.Connection, i: int) -> float:
    name = sql.Identifier(f"{_setup.ROLE_PREFIX}floor{i}")
    start = time.perf_counter()
    with conn.transaction():
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(name))
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(name, name))
        for t in range(6):
            conn.execute(sql.SQL("CREATE TABLE {}.{} (id bigserial PRIMARY KEY, v text)").format(
                name, sql.Identifier(f"t{t}")))
    return time.perf_counter() - start


def ours_once(operator, i: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    tenant, _ = tenant_onboard(operator=operator, slug=f"lat-{i}", name=f"Latency {i}",
                               actor=SYSTEM, allow_no_release=True)
    outcome = workflow_execute(str(WorkflowRun.objects.get(tenant=tenant).pk))
    elapsed = time.perf_counter() - start
    assert outcome == "succeeded", outcome
    return elapsed


def latencies(operator) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """(floor, ours) seconds, one of each per round, who goes first alternating: drift hits both alike."""
    floor, ours = [], []
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        for i in range(N_LATENCY):
            if i % 2:
                ours.append(ours_once(operator, i))
                floor.append(floor_once(conn, i))
            else:
                floor.append(floor_once(conn, i))
                ours.append(ours_once(operator, i))
    return floor, ours


def bulk_with_two_workers(operator) -> float:  # type: ignore[no-untyped-def]
    workers = [_stack.worker(name=f"bulk{i}") for i in range(2)]
    try:
        time.sleep(_run.seconds("BENCH_WORKERS_UP_S", 3.0, smoke=1.0))  # both workers up before the clock starts
        start = time.perf_counter()
        for i in range(N_BULK):
            tenant_onboard(allow_no_release=True, operator=operator, slug=f"bulk-{i}", name=f"Bulk {i}", actor=SYSTEM)
        bulk = Tenant.objects.filter(slug__startswith="bulk-")
        while bulk.filter(status=TenantStatus.READY).count() < N_BULK:
            failed = bulk.filter(status=TenantStatus.FAILED).first()
            if failed is not None:
                raise RuntimeError(f"onboarding {failed.slug} failed: {failed.status_reason}")
            if any(w.poll() is not None for w in workers):
                raise RuntimeError("a Celery worker exited during the bulk onboarding")
            if time.perf_counter() - start > 900:
                raise RuntimeError("bulk onboarding did not finish within 15 minutes")
            time.sleep(0.5)
        return time.perf_counter() - start
    finally:
        _stack.stop(workers)


def schema_version_check() -> tuple[float, float, int]:
    schemas = list(Tenant.objects.filter(slug__startswith="bulk-").values_list("id", flat=True))
    names = [f"{_setup.ROLE_PREFIX}{tid.hex}" for tid in schemas]
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        start = time.perf_counter()
        for name in names:
            runtime_migrations.migrate(conn, name)
        migrate_s = time.perf_counter() - start
        start = time.perf_counter()
        stale = runtime_migrations.schemas_needing_migration(conn, names)
        check_s = time.perf_counter() - start
    assert stale == [], stale
    return migrate_s, check_s, len(names)


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-ops", name="Bench", actor=SYSTEM)
    operator.tenant_quota = 10 * (N_LATENCY + N_BULK)
    operator.save()
    console.print(f"PostgreSQL: {_setup.SERVER_URL.rsplit('@', 1)[-1]}  database {_setup.DB_NAME}")

    floor, ours = latencies(operator)
    f50, f95 = _setup.percentiles(floor)
    o50, o95 = _setup.percentiles(ours)
    bulk_s = bulk_with_two_workers(operator)
    migrate_s, check_s, n_schemas = schema_version_check()

    table = Table(title="Onboarding (control-plane work, instance boot deferred)")
    for col in ("measure", "p50 / total", "p95", "ratio / goal"):
        table.add_column(col)
    table.add_row(f"floor: role + schema + 6 tables, 1 txn (n={N_LATENCY})", f"{f50:.1f} ms", f"{f95:.1f} ms",
                  "anchor (alternating with ours)")
    table.add_row(f"ours: onboard one tenant, all steps (n={N_LATENCY})", f"{o50:.1f} ms", f"{o95:.1f} ms",
                  f"{o50 / f50:.1f}x floor; goal p50 < 100 ms")
    table.add_row(f"{N_BULK} tenants, two workers", f"{bulk_s:.1f} s", "",
                  f"{N_BULK / bulk_s:.1f} tenants/s; goal < 180 s")
    table.add_row(f"apply runtime migrations to {n_schemas} schemas", f"{migrate_s:.1f} s", "", "")
    table.add_row(f"check {n_schemas} schemas at current version", f"{check_s * 1000:.0f} ms", "", "goal < 5 s")
    console.print(table)
    _run.ratio_line("onboarding", "one tenant onboarded / floor, p50", o50 / f50, f"(floor {f50:.1f} ms)")
    out = {"floor_p50_ms": f50, "floor_p95_ms": f95, "ours_p50_ms": o50, "ours_p95_ms": o95,
           "ratio_p50": o50 / f50, "bulk_tenants": N_BULK, "bulk_s": bulk_s,
           "schemas": n_schemas, "migrate_s": migrate_s, "version_check_ms": check_s * 1000}
    _run.write_json("onboarding", out)


if __name__ == "__main__":
    main()
