"""Moving a tenant with 100 MB of state between two PostgreSQL servers: the instance's unavailability, p50.

Two private PostgreSQL 15 servers (trust on 127.0.0.1 only) stand for two database servers; the control plane's
database and the first tenant server are the first. One live local instance; its schema gets
``BENCH_MOVE_MB`` (100) of rows in a table of its own besides the runtime's. Each move runs the product's
workflow (``database_move_start`` then ``workflow_execute`` in this process: drain, copy, verify, switch,
resume, drop_source) and alternates direction (``BENCH_MOVE_ROUNDS``, 3).

Unavailability: from the drain step's start (the instance is asked to stop) to the resume step's end (it runs
on the target). Anchors, measured in the same run on the same schema: the bare copy a move cannot beat
(``pg_dump --schema | psql`` between the two servers) and a plain graceful restart of the instance, so the
ratio says what the move's fencing, verification and switch cost beyond copying and restarting.
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MB = int(os.environ.get("BENCH_MOVE_MB", "100"))
ROUNDS = int(os.environ.get("BENCH_MOVE_ROUNDS", "3"))

from bench import _pg  # noqa: E402

A_BASE, A_URL = _pg.start("move-a", options="-c max_connections=100 -c shared_buffers=256MB")
B_BASE, B_URL = _pg.start("move-b", options="-c max_connections=100 -c shared_buffers=256MB")
atexit.register(_pg.stop, A_BASE)  # registered before _setup's clean-up, so they run after it
atexit.register(_pg.stop, B_BASE)
os.environ["BENCH_POSTGRES_URL"] = A_URL
os.environ["TENANT_DATABASE_ALLOW_INSECURE_AUTH"] = "true"  # the private servers trust 127.0.0.1
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""  # a real local instance
import django  # noqa: E402

from bench import _setup  # noqa: E402, F401  (environment first: it creates the database and cleans up)

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from psycopg import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.database_move import database_move_start  # noqa: E402
from provisioning.database_servers import database_server_add, settings_server_ensure  # noqa: E402
from provisioning.drivers.pg_admin import admin_conninfo, tenant_admin_connect  # noqa: E402
from provisioning.engine import workflow_execute  # noqa: E402
from provisioning.instances import instance_start  # noqa: E402
from provisioning.models import WorkflowRun  # noqa: E402
from provisioning.schema_archive import _pg_bin  # noqa: E402
from provisioning.tenant_actions import instance_stop_planned  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create, tenant_onboard  # noqa: E402

console = Console(width=120)


def _fill(tenant: Tenant, mb: int) -> int:
    """``mb`` MB of rows (1 KiB each) in a table the tenant owns, beside the runtime's; returns its size in bytes."""
    ident = sql.Identifier(tenant.resource_name)
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {}.bench_state (id bigserial PRIMARY KEY, payload text)").format(ident))
        conn.execute(sql.SQL("ALTER TABLE {}.bench_state OWNER TO {}").format(ident, ident))
        conn.execute(sql.SQL("INSERT INTO {}.bench_state (payload) SELECT repeat(md5(g::text), 32)"
                             " FROM generate_series(1, %s) g").format(ident), (mb * 1024,))
        return int(conn.execute("SELECT pg_total_relation_size(%s::regclass)",
                                (f"{tenant.resource_name}.bench_state",)).fetchone()[0])


def _bare_copy_s(tenant: Tenant, source_url: str, target_url: str) -> float:
    """The anchor: the schema dumped from one server straight into a scratch database on the other."""
    with psycopg.connect(target_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_copy")
        conn.execute("CREATE DATABASE bench_copy")
    started = time.perf_counter()
    dump = subprocess.run([_pg_bin("pg_dump"), "--schema", tenant.resource_name, "--no-owner", "--no-privileges",
                           "--dbname", source_url], capture_output=True, check=True).stdout
    subprocess.run([_pg_bin("psql"), "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1", "--single-transaction",
                    "--dbname", target_url.rsplit("/", 1)[0] + "/bench_copy"], input=dump, capture_output=True,
                   check=True)
    return time.perf_counter() - started


def _restart_s(tenant: Tenant) -> float:
    started = time.perf_counter()
    instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench: plain restart")
    instance_start(tenant=tenant, actor=SYSTEM)
    return time.perf_counter() - started


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-move", name="Bench move", actor=SYSTEM)
    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=B_URL.rsplit("/", 1)[0] + "/postgres")
    tenant, _ = tenant_onboard(operator=operator, slug="mover", name="Mover", actor=SYSTEM)
    if workflow_execute(str(WorkflowRun.objects.get(tenant=tenant).pk)) != "succeeded":
        raise RuntimeError("onboarding failed")
    size = _fill(tenant, MB)
    console.print(f"two PostgreSQL 15 servers; one live instance; {size / 2**20:.0f} MiB in its schema")
    source_url = psycopg.conninfo.make_conninfo(**admin_conninfo("default"))
    copy_s = _bare_copy_s(tenant, source_url, B_URL)
    restart_s = [_restart_s(tenant) for _ in range(3)]
    rows = []
    targets = ["second", "default"]
    try:
        for i in range(ROUNDS):
            move = database_move_start(tenant=tenant, target=targets[i % 2], actor=SYSTEM)
            started = time.perf_counter()
            outcome = workflow_execute(str(move.run_id))
            total = time.perf_counter() - started
            run = WorkflowRun.objects.get(pk=move.run_id)
            if outcome != "succeeded":
                raise RuntimeError(f"move {i}: {outcome}: {run.error}")
            steps = {s.name: s for s in run.steps.all()}
            unavailable = (steps["resume"].finished_at - steps["drain"].started_at).total_seconds()
            rows.append({"to": targets[i % 2], "total_s": total, "unavailable_s": unavailable,
                         **{f"{n}_s": (st.finished_at - st.started_at).total_seconds() for n, st in steps.items()}})
    finally:
        instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench over")
    unavailable_p50 = statistics.median(r["unavailable_s"] for r in rows)
    restart_p50 = statistics.median(restart_s)
    table = Table(title=f"Moving a tenant with {size / 2**20:.0f} MiB of state ({ROUNDS} moves, alternating)")
    for col in ("measure", "p50", "ratio / note"):
        table.add_column(col)
    table.add_row("anchor: bare pg_dump | psql of the schema", f"{copy_s:.2f} s", "anchor")
    table.add_row("anchor: plain graceful restart of the instance", f"{restart_p50:.2f} s", "anchor")
    table.add_row("move: instance unavailable (drain start -> resumed on target)", f"{unavailable_p50:.2f} s",
                  f"{unavailable_p50 / (copy_s + restart_p50):.2f}x (bare copy + restart)")
    for name in ("drain", "copy", "verify", "switch", "resume", "drop_source"):
        table.add_row(f"  step {name}", f"{statistics.median(r[name + '_s'] for r in rows):.2f} s", "")
    table.add_row("move, whole workflow", f"{statistics.median(r['total_s'] for r in rows):.2f} s",
                  "drop_source runs after the instance is back")
    console.print(table)
    results = ROOT / "var" / "bench"
    results.mkdir(parents=True, exist_ok=True)
    (results / "move.json").write_text(json.dumps({"mib": size / 2**20, "rounds": rows, "bare_copy_s": copy_s,
                                                   "restart_s": restart_s, "unavailable_p50_s": unavailable_p50},
                                                  indent=2))


if __name__ == "__main__":
    main()
