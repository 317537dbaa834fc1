"""Driver contract and the frozen values passed between workflows and drivers. No I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType, Protocol

__all__ = ["TenantId", "TenantSpec", "Ref", "Observed", "ResourceDriver"]

TenantId = NewType("TenantId", str)


@dataclass(frozen=True)
class Ref:
    """What a driver created: an external id plus non-secret details other steps need."""

    external_id: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TenantSpec:
    tenant_id: TenantId
    resource_name: str  # derived from the tenant id: safe as a schema, role, directory or namespace name
    operator_slug: str
    plan: str = "standard"
    # Refs of resources already ensured, by kind: the runtime needs the database's, volume's, ...
    resources: Mapping[str, Ref] = field(default_factory=dict)
    # Secrets handed to a driver for this call only; excluded from repr so they never reach a log.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The operator's agent release the instance runs: ``version``, ``digest`` ("sha256:<hex>"), and either ``env``
    # (a wheel: the absolute path of its install directory) or ``image`` (a container image pinned by that digest),
    # the other one empty. Empty: the agents installed with the runtime itself.
    release: Mapping[str, str] = field(default_factory=dict)
    # The ``DatabaseServer`` holding the tenant's schema (its placement); empty: the one TENANT_DATABASE_URL names.
    database_server: str = ""


@dataclass(frozen=True)
class Observed:
    exists: bool
    healthy: bool
    detail: str = ""


class ResourceDriver(Protocol):
    name: str

    def ensure(self, spec: TenantSpec) -> Ref:
        """Create the resource or repair it to match ``spec``; calling it twice changes nothing."""
        ...

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed: ...

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        """Remove the resource; deleting something already gone is not an error."""
        ...
