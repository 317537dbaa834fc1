"""Failing a tenant database server over to its streaming standby: promote, repoint the record, restart.

``database_server_failover`` is the operator's decision carried out, not a failure detector: it runs when staff
(or the automation that owns the decision) say the primary is lost. It refuses while the primary still
answers, because a second primary beside a live one splits the tenants' history in two (``force`` overrides,
for a primary that answers but is known to be fenced: its disks read-only, its network cut).

Each phase can be interrupted and the whole call run again, and it converges:

1. promote: ``pg_promote()`` on the standby, skipped when it already left recovery (an earlier run promoted it);
2. swap: in one transaction the record's ``dsn`` becomes the promoted standby and ``standby_dsn`` empty, with an
   audit row naming both targets and the new primary's clock at the swap (``promoted_at``);
3. restart: every instance of the server's tenants that is meant to run and has not booted on the new primary
   since ``promoted_at`` is restarted (``instance_restart``), so it is started with a DSN read from the record
   again; a second run finds the ones already restarted by their ``boot`` row there and leaves them alone.

What this module does not do: detect the loss (Patroni, a cloud's managed failover or a human decide), fence
the old primary, make a new standby, or fail over the control plane's own database.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg
from django.db import transaction
from django.utils.dateparse import parse_datetime

from controlplane.errors import Conflict, NotFound, ProvisioningError
from provisioning.choices import InstanceStatus
from provisioning.databases.servers import dsn_target
from provisioning.fleet.actions import RESTARTABLE, instance_restart
from provisioning.models import DatabaseServer
from provisioning.resources import runtime_tables
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog, Tenant

__all__ = ["FailoverResult", "database_server_failover"]

log = logging.getLogger(__name__)

FAILOVER_ACTION = AuditAction.DATABASE_SERVER_FAILOVER
_CONNECT_TIMEOUT_S = 5
_PROMOTE_WAIT_S = 60
# Meant to run: restarted. Stopped (planned, asleep) stays stopped; a recovery in progress starts the instance
# itself from the repointed record; a quarantined one waits for staff (recovery_retry), as it did before.
_RESTART_STATUSES = (InstanceStatus.RUNNING, InstanceStatus.STARTING, InstanceStatus.FAILED)


@dataclass(frozen=True)
class FailoverResult:
    """What one call did. ``promoted``: this call promoted the standby (False: an earlier run had)."""

    server: str
    primary: str  # host/port/dbname of the new primary
    promoted: bool
    swapped: bool
    restarted: list[str] = field(default_factory=list)  # tenant slugs
    already_on_new_primary: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # slug -> why it was left alone
    failed: dict[str, str] = field(default_factory=dict)  # slug -> why its restart failed
    switched_s: float = 0.0  # from the call to the record naming the new primary (promotion included)
    seconds: float = 0.0  # the whole call, restarts included


def _conninfo(dsn: str) -> dict[str, Any]:
    # A record's DSNs hold no password (database_server_add refuses one): libpq finds it in the passfile.
    return {**psycopg.conninfo.conninfo_to_dict(dsn), "connect_timeout": _CONNECT_TIMEOUT_S}


def _connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(**_conninfo(dsn), autocommit=True, application_name="controlplane-failover")


def _one(conn: psycopg.Connection, query: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """The single row a query of the server's own functions always returns."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise ProvisioningError(f"the server returned no row for {query.split('(')[0]}")
    return tuple(row)


def _target(dsn: str) -> str:
    return "/".join(dsn_target(dict(psycopg.conninfo.conninfo_to_dict(dsn))))


def _primary_answers(dsn: str) -> bool:
    """Whether the recorded primary accepts a connection and is not itself in recovery."""
    try:
        with _connect(dsn) as conn:
            return not _one(conn, "SELECT pg_is_in_recovery()")[0]
    except psycopg.Error:
        return False


def _promote(server: DatabaseServer, *, force: bool) -> tuple[bool, dict[str, Any]]:
    """Promote the standby unless it already is a primary. Returns (promoted by this call, facts to audit)."""
    try:
        conn = _connect(server.standby_dsn)
    except psycopg.Error as exc:
        # The class only: libpq's message can quote the connection string.
        raise ProvisioningError(f"the standby of {server.name} does not answer ({type(exc).__name__}): "
                                "nothing was changed") from None
    with conn:
        in_recovery, received, replayed = _one(
            conn, "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text")
        if not in_recovery:
            return False, {"standby_was": "already promoted"}
        primary_answered = _primary_answers(server.dsn)
        if primary_answered and not force:
            raise Conflict(f"the primary of {server.name} still answers: promoting its standby now would make two "
                           "primaries (split brain). Stop or fence the primary first, or force the failover once "
                           "it can no longer be written to")
        # pg_promote waits until the standby has replayed every WAL record it holds and left recovery: with
        # synchronous replication that includes every commit the primary acknowledged.
        if not _one(conn, "SELECT pg_promote(true, %s)", (_PROMOTE_WAIT_S,))[0]:
            raise ProvisioningError(f"the standby of {server.name} did not finish promotion within "
                                    f"{_PROMOTE_WAIT_S} s: run the failover again")
    return True, {"standby_was": "in recovery", "received_lsn": received, "replayed_lsn": replayed,
                  "primary_answered": primary_answered, "forced": force}


def _swap(server: DatabaseServer, *, standby_dsn: str, actor: Actor, facts: dict[str, Any]) -> tuple[
        DatabaseServer, datetime]:
    """The record names the promoted standby as its primary; audited in the same transaction."""
    with _connect(standby_dsn) as conn:
        promoted_at: datetime = _one(conn, "SELECT clock_timestamp()")[0]  # the new primary's own clock
    with transaction.atomic():
        locked = DatabaseServer.objects.select_for_update().get(pk=server.pk)
        if locked.standby_dsn != standby_dsn:
            raise Conflict(f"the record of {server.name} changed during the failover: run it again")
        old = locked.dsn
        locked.dsn, locked.standby_dsn = standby_dsn, ""
        locked.save(update_fields=["dsn", "standby_dsn", "updated_at"])
        audit_record(actor=actor, action=FAILOVER_ACTION, target=locked, data={
            "name": locked.name, "from": _target(old), "to": _target(standby_dsn),
            "promoted_at": promoted_at.isoformat(), **facts})
    return locked, promoted_at


def _last_failover_to_current(server: DatabaseServer) -> datetime | None:
    """``promoted_at`` of the failover that made the record's current DSN its primary, if one did."""
    row = (AuditLog.objects.filter(action=FAILOVER_ACTION, target_type=DatabaseServer._meta.label,
                                   target_id=str(server.pk)).order_by("-id").first())
    if row is None or row.data.get("to") != _target(server.dsn):
        return None
    promoted_at: datetime | None = parse_datetime(str(row.data.get("promoted_at", "")))
    return promoted_at


def _booted_since(server: DatabaseServer, schemas: list[str], since: datetime) -> set[str]:
    """The schemas whose instance wrote a ``boot`` row on the (new) primary at or after ``since``."""
    booted: set[str] = set()
    with _connect(server.dsn) as conn:
        for schema in schemas:
            try:
                booted_at = runtime_tables.last_event_at(conn, schema, "boot")
            except psycopg.errors.UndefinedTable:  # never booted anywhere (schema made, instance not yet)
                continue
            if booted_at is not None and booted_at >= since:
                booted.add(schema)
    return booted


def _restart_instances(server: DatabaseServer, *, since: datetime, actor: Actor, result: FailoverResult) -> None:
    tenants = list(Tenant.objects.filter(database_placement__server=server).select_related("instance")
                   .order_by("created_at"))
    candidates: list[Tenant] = []
    for tenant in tenants:
        status = getattr(getattr(tenant, "instance", None), "status", None)
        if tenant.status not in RESTARTABLE:
            result.skipped[tenant.slug] = f"tenant {tenant.status}"
        elif status not in _RESTART_STATUSES:
            result.skipped[tenant.slug] = f"instance {status or 'missing'}"
        else:
            candidates.append(tenant)
    booted = _booted_since(server, [t.resource_name for t in candidates], since)
    for tenant in candidates:
        if tenant.resource_name in booted:
            result.already_on_new_primary.append(tenant.slug)
            continue
        try:
            instance_restart(tenant=tenant, actor=actor)  # stops what is left of it, starts it on the record's DSN
        except Exception as exc:  # one tenant's failure must not keep the others on a dead server
            result.failed[tenant.slug] = str(exc)[:300]
            log.warning("instance not restarted after failover", extra={
                "event": "failover_restart_failed", "tenant": tenant.slug, "error": str(exc)[:300]})
        else:
            result.restarted.append(tenant.slug)


def database_server_failover(*, name: str, actor: Actor, force: bool = False) -> FailoverResult:
    """Promote ``name``'s standby, make it the record's primary and restart the server's instances on it.

    Safe to run again after a crash at any point: a promoted standby is not promoted twice, a swapped record is
    recognised by its audit row, and instances already booted on the new primary are left running.
    """
    started = time.monotonic()
    server = DatabaseServer.objects.filter(name=name).first()
    if server is None:
        raise NotFound(f"no database server named {name!r}")
    if server.from_settings:
        raise Conflict(f"{name} is the server TENANT_DATABASE_URL names: its record follows the setting, so it "
                       "cannot be repointed here. Give that setting a host name that follows the primary (a cloud "
                       "endpoint, a Patroni-managed address), or add servers with a standby as their own records")
    if server.standby_dsn:
        standby_dsn = server.standby_dsn
        promoted, facts = _promote(server, force=force)
        server, since = _swap(server, standby_dsn=standby_dsn, actor=actor, facts=facts)
        swapped = True
    else:
        found = _last_failover_to_current(server)
        if found is None:
            raise Conflict(f"database server {name} names no standby: nothing to fail over to")
        promoted, swapped, since = False, False, found  # an earlier run swapped the record: finish its restarts
    result = FailoverResult(server=name, primary=_target(server.dsn), promoted=promoted, swapped=swapped,
                            switched_s=round(time.monotonic() - started, 3))
    _restart_instances(server, since=since, actor=actor, result=result)
    result = replace(result, seconds=round(time.monotonic() - started, 2))
    with transaction.atomic():
        audit_record(actor=actor, action=AuditAction.DATABASE_SERVER_FAILOVER_INSTANCES, target=server, data={
            "name": name, "restarted": len(result.restarted), "already": len(result.already_on_new_primary),
            "skipped": len(result.skipped), "failed": sorted(result.failed), "seconds": result.seconds})
    return result
