"""Move a tenant's schema to another database server: a resumable workflow (kind ``move``).

drain -> copy -> verify -> switch -> resume -> drop_source, each step idempotent, so a worker killed anywhere
resumes where it was (the engine runs the step again). The guarantees, and where each comes from:

- nothing written after the copy is lost: ``drain`` stops the instance and then fences the source (the tenant's
  role there gets NOLOGIN and its sessions are ended), so no writer can reach the source schema again;
- no tenant points at a half-copied schema: the placement changes only in ``switch``, after ``verify`` matched
  every table's row count and order-independent checksum on both servers;
- the source is dropped only after the switch (``drop_source``); a move that fails before the switch unfences
  the source, drops the partial copy and starts the instance where it was.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from psycopg import sql

from controlplane.errors import Conflict, NotFound, ProvisioningError
from provisioning.choices import DatabaseServerState, InstanceStatus, ResourceKind, WorkflowKind, WorkflowStatus
from provisioning.databases.archives import schema_copy
from provisioning.databases.servers import tenant_database_server
from provisioning.drivers.base import Ref, TenantSpec
from provisioning.drivers.pg_admin import admin_connect, admin_conninfo
from provisioning.drivers.postgres_schema import PostgresSchemaDriver
from provisioning.models import (
    AgentInstance,
    DatabaseMove,
    DatabasePlacement,
    DatabaseServer,
    ProvisionedResource,
    WorkflowRun,
)
from provisioning.recovery.steps import Unrecoverable
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.steps import StepContext, StepFn
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["MOVE_STEPS", "database_move_start", "database_move_failed", "schema_fingerprint", "move_in_progress"]

log = logging.getLogger(__name__)

MOVABLE = (TenantStatus.READY, TenantStatus.DEGRADED)


def move_in_progress(tenant: Tenant) -> DatabaseMove | None:
    """The tenant's unfinished move, if any: while it runs nothing may start the instance on the source."""
    return (DatabaseMove.objects.select_related("source", "target")
            .filter(tenant=tenant, run__status__in=(WorkflowStatus.PENDING, WorkflowStatus.RUNNING)).first())


def database_move_start(*, tenant: Tenant, target: str, actor: Actor) -> DatabaseMove:
    """Queue the move of ``tenant``'s schema to the server named ``target`` (staff only)."""
    from provisioning.services import workflow_start

    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.status not in MOVABLE:
            raise Conflict(f"only a ready or degraded tenant can be moved (this one is {locked.status})")
        server = DatabaseServer.objects.filter(name=target).first()
        if server is None:
            raise NotFound(f"no database server named {target!r}")
        source = tenant_database_server(locked)
        if source.pk == server.pk:
            raise Conflict(f"the tenant's schema is on {target} already")
        if server.state != DatabaseServerState.ACTIVE:
            raise Conflict(f"database server {target} is draining: it takes no tenants")
        if server.placements.count() >= server.capacity:
            raise Conflict(f"database server {target} is at capacity ({server.capacity} tenants)")
        if move_in_progress(locked) is not None:
            raise Conflict("the tenant is being moved already")
        run = workflow_start(tenant=locked, kind=WorkflowKind.MOVE, actor=actor)
        move = DatabaseMove.objects.create(run=run, tenant=locked, source=source, target=server)
        audit_record(actor=actor, action=AuditAction.DATABASE_MOVE_START, target=run, tenant=locked,
                     data={"from": source.name, "to": server.name})
    return move


def _move(ctx: StepContext) -> DatabaseMove:
    return DatabaseMove.objects.select_related("source", "target").get(run=ctx.run)


def _fence(server: str, role: str, *, login: bool) -> None:
    """Let the tenant's role log in to ``server`` again, or stop it and end its sessions there."""
    with admin_connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            return
        conn.execute(sql.SQL("ALTER ROLE {} {}").format(sql.Identifier(role), sql.SQL("LOGIN" if login else "NOLOGIN")))
        if not login:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))


def step_move_drain(ctx: StepContext) -> dict[str, Any]:
    """Stop the instance (planned) and fence the source: from here on nothing writes the source schema."""
    from provisioning.fleet.actions import instance_stop_planned

    move = _move(ctx)
    instance = AgentInstance.objects.filter(tenant=ctx.tenant).first()
    if move.was_running is None:  # first attempt only: a retry finds the instance stopped by this move
        running = instance is not None and instance.status == InstanceStatus.RUNNING
        DatabaseMove.objects.filter(pk=move.pk).update(was_running=running)
    if instance is not None and instance.status == InstanceStatus.ASLEEP:
        # Nothing runs once its stop for idleness finished; it stays asleep (a wake waits for the switch, and
        # wakes it on the target). Still stopping: retried until the stop is done.
        if instance.asleep_at is None:
            raise ProvisioningError("the instance is still going to sleep")
    elif instance is not None and instance.status != InstanceStatus.STOPPED:
        instance_stop_planned(tenant=ctx.tenant, actor=SYSTEM, reason=f"moving its database to {move.target}")
    else:
        AgentInstance.objects.filter(tenant=ctx.tenant).update(
            status_reason=f"moving its database to {move.target}")
    _fence(move.source.name, ctx.tenant.resource_name, login=False)
    DatabaseMove.objects.filter(pk=move.pk, drained_at__isnull=True).update(drained_at=timezone.now())
    return {"was_running": DatabaseMove.objects.values_list("was_running", flat=True).get(pk=move.pk)}


def _target_spec(tenant: Tenant, server: str, **kw: Any) -> TenantSpec:
    spec = tenant_spec(tenant, **kw)
    from dataclasses import replace

    return replace(spec, database_server=server)


def step_move_copy(ctx: StepContext) -> dict[str, Any]:
    """Dump the (fenced) source schema and load it into a fresh schema of the same role on the target.

    A copy left by a killed attempt is dropped first: each attempt starts from an empty target schema.
    """
    move = _move(ctx)
    name = ctx.tenant.resource_name
    driver = PostgresSchemaDriver()
    spec = _target_spec(ctx.tenant, move.target.name, with_secrets=("db_password",))
    with admin_connect(move.target.name, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    driver.ensure(spec)  # the role (same password) and an empty schema, hardened as at onboarding
    copied = schema_copy(ctx.tenant, source=move.source.name, target=move.target.name)  # streamed, not held
    DatabaseMove.objects.filter(pk=move.pk).update(copied_bytes=copied)
    return {"bytes": copied}


def schema_fingerprint(server: str, schema: str) -> dict[str, list[int]]:
    """Per table: [rows, checksum]; the checksum sums a 64-bit slice of each row's md5, so row order is moot."""
    with admin_connect(server, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY 1", (schema,)).fetchall()]
        found: dict[str, list[int]] = {}
        for table in tables:
            row = conn.execute(sql.SQL(
                "SELECT count(*), coalesce(sum(('x' || substr(md5(t::text), 1, 15))::bit(60)::bigint), 0)"
                " FROM {}.{} t").format(sql.Identifier(schema), sql.Identifier(table))).fetchone()
            assert row is not None  # an aggregate without GROUP BY returns exactly one row
            rows, checksum = row
            found[table] = [int(rows), int(checksum)]
        for (seq, value) in conn.execute(
                "SELECT sequencename, coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = %s",
                (schema,)).fetchall():
            found[f"sequence:{seq}"] = [int(value), 0]
    return found


def step_move_verify(ctx: StepContext) -> dict[str, Any]:
    """Every table's rows and checksum, and every sequence, equal on both servers; else the move fails."""
    move = _move(ctx)
    name = ctx.tenant.resource_name
    source, target = schema_fingerprint(move.source.name, name), schema_fingerprint(move.target.name, name)
    if source != target:
        differ = sorted(k for k in source.keys() | target.keys() if source.get(k) != target.get(k))
        raise Unrecoverable(f"the copy on {move.target} differs from the source in {', '.join(differ[:10])}")
    DatabaseMove.objects.filter(pk=move.pk).update(verified=source)
    return {"tables": sum(1 for k in source if not k.startswith("sequence:")),
            "rows": sum(v[0] for k, v in source.items() if not k.startswith("sequence:"))}


def step_move_switch(ctx: StepContext) -> dict[str, Any]:
    """Point the tenant at the target: its placement and its database resource's record, in one transaction."""
    move = _move(ctx)
    info = admin_conninfo(move.target.name)
    with transaction.atomic():
        DatabasePlacement.objects.update_or_create(tenant=ctx.tenant, defaults={"server": move.target})
        resource = ProvisionedResource.objects.select_for_update().get(tenant=ctx.tenant, kind=ResourceKind.DATABASE)
        resource.details = {**resource.details, "server": move.target.name, "host": info.get("host", ""),
                            "port": str(info.get("port", "")), "dbname": info.get("dbname", "")}
        resource.external_id = f"{info.get('dbname', '')}/{ctx.tenant.resource_name}"
        resource.save(update_fields=["details", "external_id", "updated_at"])
        if move.switched_at is None:
            DatabaseMove.objects.filter(pk=move.pk).update(switched_at=timezone.now())
            audit_record(actor=SYSTEM, action=AuditAction.DATABASE_MOVE_SWITCH, target=ctx.run, tenant=ctx.tenant,
                         data={"from": move.source.name, "to": move.target.name})
    return {"server": move.target.name}


def step_move_resume(ctx: StepContext) -> dict[str, Any]:
    """Start the instance again, now on the target, if the move stopped a running one."""
    from provisioning.fleet.instances import instance_start

    move = _move(ctx)
    if move.was_running:
        instance_start(tenant=ctx.tenant, actor=SYSTEM)
    else:
        AgentInstance.objects.filter(tenant=ctx.tenant, status=InstanceStatus.STOPPED).update(status_reason="")
    DatabaseMove.objects.filter(pk=move.pk, resumed_at__isnull=True).update(resumed_at=timezone.now())
    return {"started": bool(move.was_running)}


def step_move_drop_source(ctx: StepContext) -> dict[str, Any]:
    """Drop the schema and the role on the source: only now, after the switch."""
    move = _move(ctx)
    if move.switched_at is None:  # the engine runs steps in order; this is the invariant, said once more
        raise Unrecoverable("refusing to drop the source of a move that has not switched")
    spec = _target_spec(ctx.tenant, move.source.name)
    resource = ProvisionedResource.objects.get(tenant=ctx.tenant, kind=ResourceKind.DATABASE)
    PostgresSchemaDriver().delete(spec, Ref(external_id=resource.external_id, details=resource.details))
    return {"dropped": move.source.name}


MOVE_STEPS: list[tuple[str, StepFn]] = [
    ("drain", step_move_drain),
    ("copy", step_move_copy),
    ("verify", step_move_verify),
    ("switch", step_move_switch),
    ("resume", step_move_resume),
    ("drop_source", step_move_drop_source),
]


def database_move_failed(*, run: WorkflowRun, error: str) -> None:
    """A move that failed before its switch leaves the tenant where it was: source unfenced, copy dropped,
    the instance started again if it was running. After the switch the tenant is on the target already and
    only the source's cleanup is outstanding (retry the run)."""
    move = DatabaseMove.objects.select_related("source", "target", "tenant").filter(run=run).first()
    if move is None:
        return
    audit_record(actor=SYSTEM, action=AuditAction.DATABASE_MOVE_FAIL, target=run, tenant=move.tenant,
                 data={"error": error})
    if move.switched_at is not None:
        return
    name = move.tenant.resource_name
    _fence(move.source.name, name, login=True)
    try:
        with admin_connect(move.target.name, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    except Exception as exc:  # noqa: BLE001 - the target may be what failed; the next attempt drops the copy
        log.warning("move %s: the partial copy on %s was not dropped: %s", run.pk, move.target, type(exc).__name__)
    if move.was_running:
        from provisioning.fleet.instances import instance_start

        instance_start(tenant=move.tenant, actor=SYSTEM)


def wait_for_move(move: DatabaseMove, *, timeout: float | None = None) -> WorkflowRun:
    """Block until the move's run finishes (the management command's ``--wait``)."""
    deadline = time.monotonic() + (timeout or settings.RECOVERY_VERIFY_TIMEOUT_S * 10)
    while True:
        run = WorkflowRun.objects.get(pk=move.run_id)
        if run.status in (WorkflowStatus.SUCCEEDED, WorkflowStatus.FAILED) or time.monotonic() > deadline:
            return run
        time.sleep(0.5)

