"""Onboarding benchmark on real PostgreSQL: the control plane's work per tenant, against a floor.

Floor (anchor, measured in the same run): one transaction creating a role, a schema and six
small tables. Ours: ``tenant_onboard`` + the whole onboarding workflow (database, volume,
object store, vault keys, runtime record, ready) with the instance boot deferred. Then 1,000
tenants onboarded by two real Celery workers, and the check that 1,000 tenant schemas are at
the runtime's current schema version.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django  # noqa: E402

from bench import _setup  # noqa: E402  (environment first)

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from psycopg import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_runtime.state import migrations as runtime_migrations  # noqa: E402
from provisioning.drivers.pg_admin import admin_conninfo  # noqa: E402
from provisioning.engine import workflow_execute  # noqa: E402
from provisioning.models import WorkflowRun  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create, tenant_onboard  # noqa: E402

console = Console()
N_LATENCY = int(__import__("os").environ.get("BENCH_ONBOARD_N", "200"))
N_BULK = int(__import__("os").environ.get("BENCH_BULK_N", "1000"))


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
    tenant, _ = tenant_onboard(operator=operator, slug=f"lat-{i}", name=f"Latency {i}", actor=SYSTEM)
    outcome = workflow_execute(str(WorkflowRun.objects.get(tenant=tenant).pk))
    elapsed = time.perf_counter() - start
    assert outcome == "succeeded", outcome
    return elapsed


def bulk_with_two_workers(operator) -> float:  # type: ignore[no-untyped-def]
    workers = [
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
                          "--loglevel=WARNING", "-Q", __import__("os").environ["CELERY_TASK_DEFAULT_QUEUE"],
                          "--without-gossip", "--without-mingle", "-n", f"bench{i}@%h"],
                         cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL)
        for i in range(2)
    ]
    try:
        time.sleep(3)  # both workers up before the clock starts
        start = time.perf_counter()
        for i in range(N_BULK):
            tenant_onboard(operator=operator, slug=f"bulk-{i}", name=f"Bulk {i}", actor=SYSTEM)
        while Tenant.objects.filter(slug__startswith="bulk-", status="ready").count() < N_BULK:
            if time.perf_counter() - start > 900:
                raise RuntimeError("bulk onboarding did not finish within 15 minutes")
            time.sleep(0.5)
        return time.perf_counter() - start
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)


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

    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        floor = [floor_once(conn, i) for i in range(N_LATENCY)]
    ours = [ours_once(operator, i) for i in range(N_LATENCY)]
    f50, f95 = _setup.percentiles(floor)
    o50, o95 = _setup.percentiles(ours)
    bulk_s = bulk_with_two_workers(operator)
    migrate_s, check_s, n_schemas = schema_version_check()

    table = Table(title="Onboarding (control-plane work, instance boot deferred)")
    for col in ("measure", "p50 / total", "p95", "ratio / goal"):
        table.add_column(col)
    table.add_row(f"floor: role + schema + 6 tables, 1 txn (n={N_LATENCY})", f"{f50:.1f} ms", f"{f95:.1f} ms", "anchor")
    table.add_row(f"ours: onboard one tenant, all steps (n={N_LATENCY})", f"{o50:.1f} ms", f"{o95:.1f} ms",
                  f"{o50 / f50:.1f}x floor; goal p50 < 100 ms")
    table.add_row(f"{N_BULK} tenants, two workers", f"{bulk_s:.1f} s", "",
                  f"{N_BULK / bulk_s:.1f} tenants/s; goal < 180 s")
    table.add_row(f"apply runtime migrations to {n_schemas} schemas", f"{migrate_s:.1f} s", "", "")
    table.add_row(f"check {n_schemas} schemas at current version", f"{check_s * 1000:.0f} ms", "", "goal < 5 s")
    console.print(table)
    out = {"floor_p50_ms": f50, "floor_p95_ms": f95, "ours_p50_ms": o50, "ours_p95_ms": o95,
           "ratio_p50": o50 / f50, "bulk_tenants": N_BULK, "bulk_s": bulk_s,
           "schemas": n_schemas, "migrate_s": migrate_s, "version_check_ms": check_s * 1000}
    results = Path(__file__).resolve().parent.parent / "var" / "bench"
    results.mkdir(parents=True, exist_ok=True)
    (results / "onboarding.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
