"""The resource-kind table: what the control plane provisions per tenant, one declared row per kind.

Onboarding and deprovisioning (``steps``), recovery's repair and the drift check (``recovery_steps``,
``recovery``), the runtime's secrets (``steps.step_runtime`` through ``spec``) and the portal's labels read this
table instead of each listing the kinds, so a new per-tenant resource is one row here plus its driver
(docs/architecture.md, "Adding a per-tenant resource kind"). Data only: no I/O and no Django models here; the
row order is the onboarding order.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioning.choices import ResourceKind

__all__ = ["ResourceKindRow", "RESOURCE_KINDS", "DELETE_ORDER", "resource_kind", "repairable_kinds",
           "runtime_secrets"]


@dataclass(frozen=True)
class ResourceKindRow:
    """One per-tenant resource kind and what each part of the control plane does with it."""

    kind: ResourceKind
    label: str  # the portal's name for the resource ("Your resources")
    step_label: str  # the portal's name for its onboarding step (the progress list)
    delete_step: str  # the name of its deprovisioning step (stored in workflow runs: never rename)
    # A driver of the profile (``drivers.registry``) ensures, observes and deletes it; the vault's keys have none
    # (the vault app makes them) and are neither drift-checked nor deleted through a driver.
    has_driver: bool = True
    ensure_secrets: tuple[str, ...] = ()  # the secrets its driver's ``ensure`` needs in the spec
    runtime_secrets: tuple[str, ...] = ()  # the secrets of this kind the instance's environment carries
    # Recovery's repair step re-ensures it when observed unhealthy, and the drift check reports it as drift.
    repair: bool = False
    # The agent process itself: observed for health (not drift), skipped while asleep, started last by its own
    # step. Exactly one row has it.
    process: bool = False


RESOURCE_KINDS: tuple[ResourceKindRow, ...] = (
    ResourceKindRow(ResourceKind.DATABASE, "Database schema", "Database", "drop_database",
                    ensure_secrets=("db_password",), runtime_secrets=("db_password",), repair=True),
    ResourceKindRow(ResourceKind.VOLUME, "Working-files volume", "Working files", "delete_volume", repair=True),
    ResourceKindRow(ResourceKind.OBJECTSTORE, "Object-storage prefix", "Object storage", "delete_objectstore",
                    repair=True),
    ResourceKindRow(ResourceKind.VAULT, "Encryption keys", "Encryption keys", "retire_vault", has_driver=False,
                    runtime_secrets=("object_key_b64",)),
    ResourceKindRow(ResourceKind.RUNTIME, "Agent instance", "Agent instance", "stop_runtime",
                    runtime_secrets=("instance_token",), process=True),
)

# Deprovisioning order (not the reverse of onboarding): the instance stops first so nothing writes while the
# schema is archived and dropped; the keys go last because the archive is encrypted with them.
DELETE_ORDER: tuple[ResourceKind, ...] = (ResourceKind.RUNTIME, ResourceKind.DATABASE, ResourceKind.OBJECTSTORE,
                                          ResourceKind.VOLUME, ResourceKind.VAULT)

_BY_KIND = {row.kind: row for row in RESOURCE_KINDS}


def resource_kind(kind: str) -> ResourceKindRow:
    """The row of ``kind``; a kind without a row is a bug that tests/provisioning/test_resource_kinds.py catches."""
    return _BY_KIND[ResourceKind(kind)]


def repairable_kinds() -> list[ResourceKindRow]:
    """The kinds recovery re-ensures on drift, in onboarding order (the database first: the rest may need it)."""
    return [row for row in RESOURCE_KINDS if row.repair]


def runtime_secrets() -> tuple[str, ...]:
    """Every secret the instance's environment carries, gathered from the rows in table order."""
    return tuple(secret for row in RESOURCE_KINDS for secret in row.runtime_secrets)
