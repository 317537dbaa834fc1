"""Moving a tenant with 100 MB of state between two PostgreSQL servers: the instance's unavailability, p50.

Two private PostgreSQL 15 servers (trust on 127.0.0.1 only) stand for two database servers; the control plane's
database and the first tenant server are the first. One live local instance; its schema gets
``BENCH_MOVE_MB`` (100) of rows in a table of its own besides the runtime's. Each move runs the product's
workflow (``database_move_start`` then ``workflow_execute`` in this process: drain, copy, verify, switch,
resume, drop_source) and alternates direction (``BENCH_MOVE_ROUNDS``, 3).

Unavailability: from the drain step's start (the instance is asked to stop) to the resume step's end (it runs
on the target). Anchors, measured in the same run on the same schema, one of each per round beside the round's
move (the three in rotating order): the bare copy a move cannot beat (``pg_dump --schema | psql`` from the
tenant's server to a scratch database on the other) and a plain graceful restart of the instance, so the ratio
says what the move's fencing, verification and switch cost beyond copying and restarting.
"""

from __future__ import annotations

import atexit
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _pg, _run  # noqa: E402

MB = _run.size("BENCH_MOVE_MB", 100, smoke=1)
ROUNDS = _run.size("BENCH_MOVE_ROUNDS", 3, smoke=1)

A_BASE, A_URL = _pg.start("move-a", options="-c max_connections=100 -c shared_buffers=256MB")
B_BASE, B_URL = _pg.start("move-b", options="-c max_connections=100 -c shared_buffers=256MB")
atexit.register(_pg.stop, A_BASE)  # registered before _setup's clean-up, so they run after it
atexit.register(_pg.stop, B_BASE)
os.environ["BENCH_POSTGRES_URL"] = A_URL
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""  # a real local instance
import django  # noqa: E402

from bench import _setup  # noqa: E402, F401  (environment first: it creates the database and cleans up)

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from psycopg import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.databases.archives import _pg_bin  # noqa: E402
from provisioning.databases.move import database_move_start  # noqa: E402
from provisioning.databases.servers import (  # noqa: E402
    database_server_add,
    settings_server_ensure,
    tenant_database_server,
)
from provisioning.drivers.pg_admin import admin_conninfo, tenant_admin_connect  # noqa: E402
from provisioning.fleet.actions import instance_stop_planned  # noqa: E402
from provisioning.fleet.instances import instance_start  # noqa: E402
from provisioning.models import WorkflowRun  # noqa: E402
from provisioning.workflows.engine import workflow_execute  # noqa: E402
from provisioning.workflows.onboarding import tenant_onboard  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402

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
                    "--dbname", psycopg.conninfo.make_conninfo(target_url, dbname="bench_copy")], input=dump,
                   capture_output=True, check=True)
    return time.perf_counter() - started


def _restart_s(tenant: Tenant) -> float:
    started = time.perf_counter()
    instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench: plain restart")
    instance_start(tenant=tenant, actor=SYSTEM)
    return time.perf_counter() - started


def _move(tenant: Tenant, target: str) -> dict[str, object]:
    move = database_move_start(tenant=tenant, target=target, actor=SYSTEM)
    started = time.perf_counter()
    outcome = workflow_execute(str(move.run_id))
    total = time.perf_counter() - started
    run = WorkflowRun.objects.get(pk=move.run_id)
    if outcome != "succeeded":
        raise RuntimeError(f"move to {target}: {outcome}: {run.error}")
    steps = {s.name: s for s in run.steps.all()}
    unavailable = (steps["resume"].finished_at - steps["drain"].started_at).total_seconds()
    return {"to": target, "total_s": total, "unavailable_s": unavailable,
            **{f"{n}_s": (st.finished_at - st.started_at).total_seconds() for n, st in steps.items()}}


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-move", name="Bench move", actor=SYSTEM)
    settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=B_URL.rsplit("/", 1)[0] + "/postgres")
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="mover", name="Mover", actor=SYSTEM)
    if workflow_execute(str(WorkflowRun.objects.get(tenant=tenant).pk)) != "succeeded":
        raise RuntimeError("onboarding failed")
    size = _fill(tenant, MB)
    console.print(f"two PostgreSQL 15 servers; one live instance; {size / 2**20:.0f} MiB in its schema")
    urls = {"default": psycopg.conninfo.make_conninfo(**admin_conninfo("default")), "second": B_URL}
    other = {"default": "second", "second": "default"}
    rows: list[dict[str, object]] = []
    copy_s: list[float] = []
    restart_s: list[float] = []

    def where() -> tuple[Tenant, str]:
        current = Tenant.objects.get(pk=tenant.pk)
        return current, tenant_database_server(current).name

    def bare_copy() -> None:  # from the server the tenant is on now to the other one, as its next move would
        current, server = where()
        copy_s.append(_bare_copy_s(current, urls[server], urls[other[server]]))

    def restart() -> None:
        restart_s.append(_restart_s(where()[0]))

    def move() -> None:
        current, server = where()
        rows.append(_move(current, other[server]))

    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instance", lambda: instance_stop_planned(tenant=where()[0], actor=SYSTEM,
                                                                       reason="bench over"))
        for i in range(ROUNDS):
            samples = [bare_copy, restart, move]
            for sample in samples[i % 3:] + samples[:i % 3]:
                sample()
            console.print(f"  round {i + 1}/{ROUNDS}: to {rows[-1]['to']}: unavailable "
                          f"{rows[-1]['unavailable_s']:.2f} s, bare copy {copy_s[-1]:.2f} s, restart "
                          f"{restart_s[-1]:.2f} s")
    unavailable_p50 = statistics.median(r["unavailable_s"] for r in rows)
    restart_p50 = statistics.median(restart_s)
    copy_p50 = statistics.median(copy_s)
    table = Table(title=f"Moving a tenant with {size / 2**20:.0f} MiB of state ({ROUNDS} rounds of a move, a bare copy "
                        "and a restart, alternating direction)")
    for col in ("measure", "p50", "ratio / note"):
        table.add_column(col)
    table.add_row("anchor: bare pg_dump | psql of the schema", f"{copy_p50:.2f} s", "anchor")
    table.add_row("anchor: plain graceful restart of the instance", f"{restart_p50:.2f} s", "anchor")
    table.add_row("move: instance unavailable (drain start -> resumed on target)", f"{unavailable_p50:.2f} s",
                  f"{unavailable_p50 / (copy_p50 + restart_p50):.2f}x (bare copy + restart)")
    for name in ("drain", "copy", "verify", "switch", "resume", "drop_source"):
        table.add_row(f"  step {name}", f"{statistics.median(r[name + '_s'] for r in rows):.2f} s", "")
    table.add_row("move, whole workflow", f"{statistics.median(r['total_s'] for r in rows):.2f} s",
                  "drop_source runs after the instance is back")
    console.print(table)
    _run.ratio_line("move", "instance unavailable p50 / (bare copy + restart) p50",
                    unavailable_p50 / (copy_p50 + restart_p50), f"(anchors {copy_p50:.2f} + {restart_p50:.2f} s)")
    _run.write_json("move", {"mib": size / 2**20, "rounds": rows, "bare_copy_s": copy_s, "restart_s": restart_s,
                             "unavailable_p50_s": unavailable_p50})


if __name__ == "__main__":
    main()
