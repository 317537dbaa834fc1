"""Provisioning reads: recovery events, the figures behind /metrics, and where a tenant's instance API listens."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.db.models import Count, QuerySet

from provisioning.choices import InstanceStatus, RecoveryOutcome, ResourceKind
from provisioning.models import AgentInstance, ProvisionedResource, RecoveryEvent
from tenants.models import Tenant

from .drivers.local_process import (
    LocalProcessDriver,
    PortNotPublished,
    open_instance_connection,
    published_port,
    volume_host_dir,
)

__all__ = ["recovery_event_list", "recovery_counts", "recovery_durations_s", "quarantined_count",
           "InstanceLocation", "PortNotPublished", "instance_location"]


def recovery_event_list(*, tenant: Tenant) -> QuerySet[RecoveryEvent]:
    return RecoveryEvent.objects.filter(tenant=tenant).order_by("-detected_at", "-id")


def recovery_counts() -> list[tuple[str, str, int]]:
    rows = RecoveryEvent.objects.values("reason", "outcome").annotate(n=Count("id")).order_by("reason", "outcome")
    return [(r["reason"], r["outcome"], r["n"]) for r in rows]


def recovery_durations_s() -> list[float]:
    rows = RecoveryEvent.objects.filter(outcome=RecoveryOutcome.SUCCEEDED, resumed_at__isnull=False)
    return [(resumed - detected).total_seconds() for detected, resumed in rows.values_list("detected_at", "resumed_at")]


def quarantined_count() -> int:
    return AgentInstance.objects.filter(status=InstanceStatus.QUARANTINED).count()


@dataclass(frozen=True)
class InstanceLocation:
    """Where a tenant's instance API listens, as provisioning's records say (building one never asks the instance).

    An instance of the local driver publishes a new loopback port on every restart (``published_port()`` reads and
    verifies it each time it is called, so keep the location, not the port); any other driver's instance is at
    ``endpoint``. Callers (``instances.client``) need not know which driver ran the instance or where it writes.
    """

    endpoint: str  # "" for a local instance, or one whose driver has not recorded it yet
    host_dir: Path | None = None  # local driver: the directory its host publishes the port in
    tenant_id: str = ""  # local driver: whose host must hold the published port (the files are the tenant's)

    @property
    def local(self) -> bool:
        """The instance publishes its port on this machine: ask ``published_port()``, not ``endpoint``."""
        return self.host_dir is not None

    def published_port(self) -> int | None:
        """The port a local instance's own host listens on now; None when it is not running or not local."""
        return published_port(self.host_dir, self.tenant_id) if self.host_dir is not None else None

    def connect(self, *, timeout: float) -> socket.socket:
        """A connection to a local instance's API (in its own network namespace when it has one), its port verified
        once; OSError when it is not running or not local (``PortNotPublished`` when it published no port)."""
        if self.host_dir is None:
            raise ConnectionRefusedError("not a local instance")
        return open_instance_connection(self.host_dir, self.tenant_id, timeout=timeout)


def instance_location(*, tenant: Tenant, resources: Iterable[ProvisionedResource] | None = None) -> InstanceLocation:
    """Where ``tenant``'s instance API is. ``resources``: the tenant's resources when the caller already has them
    (saves a query); the runtime's driver is the one recorded on its resource, not the configured profile."""
    if resources is None:
        resources = ProvisionedResource.objects.filter(tenant=tenant,
                                                       kind__in=[ResourceKind.VOLUME, ResourceKind.RUNTIME])
    by_kind = {r.kind: r for r in resources}
    runtime, volume = by_kind.get(ResourceKind.RUNTIME), by_kind.get(ResourceKind.VOLUME)
    if (runtime is not None and runtime.driver == LocalProcessDriver.name and volume is not None
            and volume.details.get("path")):
        return InstanceLocation(endpoint="", host_dir=volume_host_dir(volume.details["path"]),
                                tenant_id=str(tenant.pk))
    endpoint = AgentInstance.objects.filter(tenant=tenant).values_list("endpoint", flat=True).first() or ""
    return InstanceLocation(endpoint=endpoint)
