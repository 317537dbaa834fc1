"""Collecting usage: each tenant's runtime tables, read through ``provisioning.resources.runtime_tables``, into
``UsageDay``.

A day's row is recomputed whole from the instance's records and upserted (``INSERT ... ON CONFLICT DO UPDATE``),
never incremented: the job run twice, two collectors racing, or a worker killed halfway all leave the same rows,
and an event is counted once whatever happened to the instance (its records survive its restarts). The beat job
collects today and yesterday (so the minutes around midnight land in the day they belong to); a day long past
can be collected again at any time with the same result, except its storage, which is measured only while the
day is current. Days missed while beat was down are caught up: a tenant's collection starts at its last collected
day (at most ``CATCH_UP_DAYS`` back; a tenant never collected starts at its creation).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

import psycopg
from django.db.models import Max, QuerySet
from django.utils import timezone

from provisioning.choices import ResourceKind, ResourceStatus
from provisioning.drivers.pg_admin import tenant_admin_connect
from provisioning.drivers.protocols import Capability, ObjectStoreDriver, VolumeDriver
from provisioning.drivers.registry import objectstore_driver, volume_driver
from provisioning.models import ProvisionedResource
from provisioning.resources import runtime_tables
from provisioning.resources.runtime_tables import DayUsage
from provisioning.resources.spec import tenant_spec
from tenants.choices import TENANT_GONE
from tenants.models import Tenant

from .models import UsageDay

__all__ = ["CATCH_UP_DAYS", "usage_collect", "usage_collect_fleet", "usage_days_due", "usage_tenants"]

CATCH_UP_DAYS = 31

log = logging.getLogger(__name__)

_COUNTS = ("tasks_submitted", "tasks_done", "tasks_failed", "steps_run", "compute_s", "messages_in",
           "messages_out", "effects_committed")


def usage_tenants() -> QuerySet[Tenant]:
    """Tenants whose schema exists to be read: a database resource that was made and not removed."""
    schemas = (ProvisionedResource.objects.filter(kind=ResourceKind.DATABASE)
               .exclude(status__in=(ResourceStatus.PROVISIONING, ResourceStatus.DELETED)).values("tenant_id"))
    return Tenant.objects.exclude(status__in=TENANT_GONE).filter(pk__in=schemas).order_by("created_at", "id")


def _values(counted: DayUsage) -> dict[str, object]:
    tokens = counted.tokens or {}
    return {
        **{name: getattr(counted, name) for name in _COUNTS},
        "compute_s": round(counted.compute_s, 3),
        "input_tokens": sum(i for i, _ in tokens.values()),
        "output_tokens": sum(o for _, o in tokens.values()),
        "tokens_by_model": {model: {"input": i, "output": o} for model, (i, o) in sorted(tokens.items())},
    }


def _driver_bytes(driver: ObjectStoreDriver | VolumeDriver, tenant: Tenant) -> tuple[int | None, str]:
    """(bytes, "") measured through the tenant's driver, or (None, why not): a driver that cannot measure (a
    Kubernetes PVC's usage is not in the API) or a store that did not answer leaves the figure null, with a reason
    an operator reads in the row, rather than failing the day's counts."""
    if Capability.MEASURE_BYTES not in driver.capabilities:
        return None, f"the {driver.name} driver cannot measure its bytes"
    try:
        return driver.bytes_used(tenant_spec(tenant)), ""
    except Exception as exc:  # noqa: BLE001 - any store error: the counts are still written
        log.warning("usage: tenant %s %s bytes not measured: %s", tenant.pk, driver.name, type(exc).__name__)
        return None, f"the {driver.name} driver failed: {type(exc).__name__}"


def usage_storage_measure(tenant: Tenant) -> tuple[dict[str, int | None], dict[str, str]]:
    """The tenant's object-store and volume bytes now, and why any of them is null."""
    measured: dict[str, int | None] = {}
    unmeasured: dict[str, str] = {}
    drivers: tuple[tuple[str, ObjectStoreDriver | VolumeDriver], ...] = (
        ("object_bytes", objectstore_driver()), ("volume_bytes", volume_driver()))
    for field, driver in drivers:
        measured[field], why = _driver_bytes(driver, tenant)
        if why:
            unmeasured[field] = why
    return measured, unmeasured


def usage_days_due(tenant: Tenant, today: date) -> list[date]:
    """Yesterday and today, and every day since the tenant's last collected one (beat was down), at most
    ``CATCH_UP_DAYS`` back; a tenant never collected from the day it was created."""
    last = UsageDay.objects.filter(tenant=tenant).aggregate(last=Max("day"))["last"]
    first = last or tenant.created_at.astimezone(UTC).date()
    start = max(today - timedelta(days=CATCH_UP_DAYS), min(first, today - timedelta(days=1)))
    return [start + timedelta(days=n) for n in range((today - start).days + 1)]


def usage_collect(*, tenant: Tenant, days: Iterable[date] | None = None, now: datetime | None = None
                  ) -> list[UsageDay]:
    """Write the tenant's ``UsageDay`` rows for ``days`` (default: ``usage_days_due``, UTC) and return them.

    A schema the runtime never migrated (its instance never booted) has no usage: the rows say zero."""
    now = now or timezone.now()
    today = now.astimezone(UTC).date()
    wanted = sorted(set(days) if days is not None else usage_days_due(tenant, today))
    if not wanted:
        return []
    schema = tenant.resource_name
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        try:
            counted = runtime_tables.usage_by_day(conn, schema, wanted[0], wanted[-1] + timedelta(days=1))
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            counted = {}
        measured = runtime_tables.schema_bytes(conn, schema) if today in wanted else None
    # Storage is a measurement of now: only today's row takes it (a past day keeps what was measured then).
    storage, unmeasured = usage_storage_measure(tenant) if today in wanted else ({}, {})
    rows = []
    for day in wanted:
        values = _values(counted.get(day) or DayUsage(day))
        fields = [*values, "collected_at"]
        if day == today:
            values.update(schema_bytes=measured, **storage, storage_unmeasured=unmeasured)
            fields += ["schema_bytes", *storage, "storage_unmeasured"]
        row = UsageDay(tenant=tenant, day=day, collected_at=now, **values)
        # One statement per row: an upsert on (tenant, day), so a racing collector cannot make a second row.
        UsageDay.objects.bulk_create([row], update_conflicts=True, unique_fields=["tenant", "day"],
                                     update_fields=fields)
        rows.append(row)
    return list(UsageDay.objects.filter(tenant=tenant, day__in=wanted).order_by("day"))


def usage_collect_fleet(*, now: datetime | None = None) -> int:
    """Collect the days due (``usage_days_due``) for every tenant with a schema; one tenant's failure (its server
    away) is logged and the others are still collected. Returns how many tenants were collected."""
    now = now or timezone.now()
    collected = 0
    for tenant in usage_tenants().select_related("operator"):
        try:
            usage_collect(tenant=tenant, now=now)
            collected += 1
        except (psycopg.Error, OSError) as exc:
            log.warning("usage: tenant %s not collected: %s", tenant.pk, type(exc).__name__)
    return collected
