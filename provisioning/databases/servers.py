"""Tenant database servers: which one holds each tenant's schema, and where new tenants go.

Every connection to a tenant's schema starts from its ``DatabasePlacement`` (never from today's
``TENANT_DATABASE_URL``): a setting changed after tenants exist must not silently point them at a server that
does not hold their data. The setting still names the default server: the record made from it takes new
tenants, and when it changes that record goes to draining and a record for the new target is made.

New tenants go to the least-loaded active server with room (tenants placed / capacity). A server record holds
no password (see ``DatabaseServer``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, FloatField
from django.db.models.functions import Cast

from controlplane.errors import Conflict, NotFound, ProvisioningError
from provisioning.choices import DatabaseServerState, ResourceKind
from provisioning.drivers.pg_admin import settings_conninfo
from provisioning.models import DatabasePlacement, DatabaseServer, ProvisionedResource
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Tenant

__all__ = ["database_server_add", "database_server_drain", "database_server_activate", "database_server_record_auth",
           "database_server_update", "tenant_database_server", "server_conninfo", "server_pooled_conninfo",
           "settings_server_ensure", "database_servers_load", "dsn_without_password", "dsn_target"]

SETTINGS_SERVER_CAPACITY = 1_000_000  # the default server's: unlimited in practice; `database_servers set` changes it


def dsn_target(info: dict[str, Any]) -> tuple[str, str, str]:
    """What identifies a server's database in a conninfo: host, port and database name (not user or password)."""
    return (str(info.get("host") or ""), str(info.get("port") or "5432"), str(info.get("dbname") or ""))


def dsn_without_password(dsn: str | dict[str, Any]) -> str:
    info = dict(psycopg.conninfo.conninfo_to_dict(dsn)) if isinstance(dsn, str) else dict(dsn)
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v not in (None, "")})


def _parse(dsn: str, *, field: str) -> dict[str, Any]:
    try:
        info = dict(psycopg.conninfo.conninfo_to_dict(dsn))
    except psycopg.ProgrammingError:
        # psycopg's message quotes the string, which may hold a password: name the field only.
        raise ProvisioningError(f"{field} is not a libpq connection string or postgresql:// URL") from None
    if info.get("password"):
        raise ProvisioningError(
            f"{field} carries a password; records hold none: put it in a libpq passfile"
            " (passfile=... in the DSN, or PGPASSFILE in the control plane's environment)")
    return info


def settings_server_ensure() -> DatabaseServer:
    """The record for the server ``TENANT_DATABASE_URL`` names now (made on first use).

    A settings record naming another target is drained here: its tenants stay on it, new ones come here.
    ``TENANT_DATABASE_POOLER_URL``, when set, is the record's pooler (instances read it when they start).
    """
    info = settings_conninfo()
    target = dsn_target(info)
    pooler = settings.TENANT_DATABASE_POOLER_URL
    if pooler:
        _parse(pooler, field="TENANT_DATABASE_POOLER_URL")
    with transaction.atomic():
        # Serialised by a lock of its own: row locks cannot keep two workers from both finding no record at first
        # use and making two (seen at a fleet's first onboardings: "default" and a draining "default-2").
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('database-servers:settings-record'))")
        records = list(DatabaseServer.objects.select_for_update().filter(from_settings=True))
        current = next((r for r in records if dsn_target(dict(psycopg.conninfo.conninfo_to_dict(r.dsn))) == target),
                       None)
        for stale in records:
            if stale is not current and stale.state == DatabaseServerState.ACTIVE:
                stale.state = DatabaseServerState.DRAINING
                stale.save(update_fields=["state", "updated_at"])
        if current is not None:
            if pooler and current.pooler_dsn != pooler:
                current.pooler_dsn = pooler
                current.save(update_fields=["pooler_dsn", "updated_at"])
            return current
        taken = set(DatabaseServer.objects.filter(name__startswith="default").values_list("name", flat=True))
        name = next(n for n in ["default", *(f"default-{i}" for i in range(2, len(taken) + 3))] if n not in taken)
        # No capacity of its own unless staff set one: on a single-server install the setting's server takes every
        # tenant (a hidden limit of 1,000 failed the 1,001st onboarding).
        return DatabaseServer.objects.create(name=name, dsn=dsn_without_password(info), from_settings=True,
                                             capacity=SETTINGS_SERVER_CAPACITY, pooler_dsn=pooler)


def database_server_add(*, name: str, dsn: str, actor: Actor, capacity: int = 1000, pooler_dsn: str = "",
                        standby_dsn: str = "") -> DatabaseServer:
    """Record another tenant database server (active: it takes new tenants from now on)."""
    info = _parse(dsn, field="dsn")
    if pooler_dsn:
        _parse(pooler_dsn, field="pooler_dsn")
    if standby_dsn:
        _parse(standby_dsn, field="standby_dsn")
    if DatabaseServer.objects.filter(name=name).exists():
        raise Conflict(f"a database server named {name!r} exists")
    target = dsn_target(info)
    for other in DatabaseServer.objects.all():
        if dsn_target(dict(psycopg.conninfo.conninfo_to_dict(other.dsn))) == target:
            raise Conflict(f"database server {other.name!r} already names that database")
    if capacity < 1:
        raise ProvisioningError("capacity must be at least 1")
    with transaction.atomic():
        server = DatabaseServer.objects.create(name=name, dsn=dsn_without_password(info), capacity=capacity,
                                               pooler_dsn=pooler_dsn, standby_dsn=standby_dsn)
        audit_record(actor=actor, action=AuditAction.DATABASE_SERVER_ADD, target=server,
                     data={"name": name, "target": "/".join(dsn_target(info)), "capacity": capacity})
    return server


def database_server_update(*, name: str, actor: Actor, capacity: int | None = None, pooler_dsn: str | None = None,
                           standby_dsn: str | None = None) -> DatabaseServer:
    """Change a server's capacity, pooler or standby (None: leave it; "": remove it); its DSN is never changed
    here (that would repoint its tenants: failover and moves do it, each with its own checks)."""
    for field, value in (("pooler_dsn", pooler_dsn), ("standby_dsn", standby_dsn)):
        if value:
            _parse(value, field=field)
    if capacity is not None and capacity < 1:
        raise ProvisioningError("capacity must be at least 1")
    with transaction.atomic():
        server = DatabaseServer.objects.select_for_update().filter(name=name).first()
        if server is None:
            raise NotFound(f"no database server named {name!r}")
        changed = {k: v for k, v in (("capacity", capacity), ("pooler_dsn", pooler_dsn), ("standby_dsn", standby_dsn))
                   if v is not None and getattr(server, k) != v}
        for key, new_value in changed.items():
            setattr(server, key, new_value)
        if changed:
            server.save(update_fields=[*changed, "updated_at"])
            audit_record(actor=actor, action=AuditAction.DATABASE_SERVER_UPDATE, target=server,
                         data={"name": name, **{k: (v if k == "capacity" else bool(v)) for k, v in changed.items()}})
    return server


_STATE_ACTIONS = {DatabaseServerState.ACTIVE: AuditAction.DATABASE_SERVER_ACTIVE,
                  DatabaseServerState.DRAINING: AuditAction.DATABASE_SERVER_DRAINING}


def _set_state(name: str, state: DatabaseServerState, actor: Actor) -> DatabaseServer:
    with transaction.atomic():
        server = DatabaseServer.objects.select_for_update().filter(name=name).first()
        if server is None:
            raise NotFound(f"no database server named {name!r}")
        if server.state != state:
            server.state = state
            server.save(update_fields=["state", "updated_at"])
            audit_record(actor=actor, action=_STATE_ACTIONS[state], target=server, data={"name": name})
    return server


def database_server_drain(*, name: str, actor: Actor) -> DatabaseServer:
    """No new tenants on ``name``; the ones there stay (moving them is a separate, explicit step)."""
    return _set_state(name, DatabaseServerState.DRAINING, actor)


def database_server_activate(*, name: str, actor: Actor) -> DatabaseServer:
    return _set_state(name, DatabaseServerState.ACTIVE, actor)


def database_servers_load() -> list[DatabaseServer]:
    """Every server with ``tenants`` (placed there) annotated, in creation order."""
    return list(DatabaseServer.objects.annotate(tenants=Count("placements")).order_by("id"))


def _place_least_loaded(tenant_id: Any) -> DatabaseServer:
    """Place a new tenant on the least-loaded active server with room (tenants placed / capacity).

    The chosen row is locked while its load is recounted, so concurrent onboardings cannot overfill it;
    ``get_or_create`` makes a concurrent placement of the same tenant return the first one.
    """
    settings_server_ensure()
    candidates = (DatabaseServer.objects.filter(state=DatabaseServerState.ACTIVE)
                  .annotate(tenants=Count("placements"))
                  .filter(tenants__lt=F("capacity"))
                  .annotate(load=Cast(F("tenants"), FloatField()) / Cast(F("capacity"), FloatField()))
                  .order_by("load", "id"))
    for candidate in candidates:
        with transaction.atomic():
            server = DatabaseServer.objects.select_for_update().get(pk=candidate.pk)
            if server.state != DatabaseServerState.ACTIVE or server.placements.count() >= server.capacity:
                continue
            placement, _ = DatabasePlacement.objects.get_or_create(tenant_id=tenant_id, defaults={"server": server})
            return placement.server
    total = DatabaseServer.objects.count()
    active = DatabaseServer.objects.filter(state=DatabaseServerState.ACTIVE).count()
    raise ProvisioningError(
        f"no tenant database server can take a new tenant ({active} of {total} active, all at capacity):"
        " add one (manage.py database_servers add) or raise a capacity")


def tenant_database_server(tenant: Tenant | Any) -> DatabaseServer:
    """The server holding the tenant's schema, placing the tenant first if it has none.

    A new tenant goes to the least-loaded active server. A tenant whose schema predates placements (it has a
    database resource but no placement) is placed where every schema lived until then: the server
    ``TENANT_DATABASE_URL`` names. Idempotent: a retried step finds the placement.
    """
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    placed = DatabasePlacement.objects.select_related("server").filter(tenant_id=tenant_id).first()
    if placed is not None:
        return placed.server
    if not ProvisionedResource.objects.filter(tenant_id=tenant_id, kind=ResourceKind.DATABASE).exists():
        return _place_least_loaded(tenant_id)
    server = settings_server_ensure()
    placement, _ = DatabasePlacement.objects.get_or_create(tenant_id=tenant_id, defaults={"server": server})
    return placement.server


def database_server_record_auth(server_name: str, auth: str) -> None:
    """Keep the authentication verdict of the server's latest provisioning on its record (shown to staff)."""
    if server_name and auth:
        DatabaseServer.objects.filter(name=server_name).exclude(auth=auth).update(auth=auth)


def server_conninfo(server: DatabaseServer) -> dict[str, Any]:
    """psycopg keyword arguments for the control plane's admin role on ``server``.

    The settings' server takes the setting's password while the setting still names it.
    """
    info = dict(psycopg.conninfo.conninfo_to_dict(server.dsn))
    if server.from_settings:
        current = settings_conninfo()
        if dsn_target(current) == dsn_target(info) and current.get("password"):
            info["password"] = current["password"]
    return info


def server_pooled_conninfo(server: DatabaseServer) -> dict[str, Any] | None:
    """Where instances connect when ``server`` has a pooler (host, port, dbname of the PgBouncer), else None."""
    if not server.pooler_dsn:
        return None
    info = dict(psycopg.conninfo.conninfo_to_dict(server.pooler_dsn))
    info.pop("user", None)
    return info

