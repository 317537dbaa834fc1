"""What each kind of driver can do, declared: one typed Protocol per kind and the capabilities callers test.

A caller never probes a driver (``hasattr(driver, "stop")``): every runtime driver has every method of
``RuntimeDriver``, and states in ``capabilities`` which of them it supports. A method it does not support
raises ``CapabilityUnsupported`` (the Protocol's default body), so a caller that forgot to test the capability
fails loudly instead of silently skipping the step. Each concrete driver subclasses its kind's Protocol;
tests/provisioning/test_driver_capabilities.py holds every driver to its declaration and fails if a probe comes back.
docs/architecture.md has the table of drivers x capabilities. No I/O here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

from controlplane.errors import ProvisioningError

from .archives import ArchiveStore
from .base import ResourceDriver, TenantSpec

__all__ = [
    "Capability", "CapabilityUnsupported", "RuntimeDriver", "ObjectStoreDriver", "DatabaseDriver", "VolumeDriver",
    "RUNTIME_CAPABILITY_METHODS",
]


class Capability(StrEnum):
    """Something only some drivers of a kind can do. A flag a caller tests, never an attribute it looks for."""

    # Runtime drivers
    PRESENT = "present"  # a cheap "is anything of the instance still running?" without a health probe
    STOP = "stop"  # graceful stop that reports a clean exit; the platform may start it again (a recovery wants that)
    SLEEP = "sleep"  # stop and stay stopped until the next ensure (scale to zero)
    PUBLISH_BRANDING = "publish_branding"  # write the operator's theme where the instance reads it
    # The platform rolls a changed template out itself in ensure() (graceful termination): no stop before it.
    ROLLS_OUT_ITSELF = "rolls_out_itself"
    # Object-store and volume drivers
    MEASURE_BYTES = "measure_bytes"  # how many bytes the tenant's data occupies there (usage metering, issue 37)


# The runtime capabilities that are a method of ``RuntimeDriver`` (ROLLS_OUT_ITSELF is a fact, not an action).
RUNTIME_CAPABILITY_METHODS: dict[Capability, str] = {
    Capability.PRESENT: "present", Capability.STOP: "stop", Capability.SLEEP: "sleep",
    Capability.PUBLISH_BRANDING: "publish_branding",
}


class CapabilityUnsupported(ProvisioningError):
    """A driver was asked for something its ``capabilities`` do not list: a caller's bug, not an outage."""

    def __init__(self, driver: ResourceDriver, capability: Capability) -> None:
        super().__init__(f"the {driver.name} driver does not support {capability.value!r}",
                         extra={"driver": driver.name, "capability": capability.value})


@runtime_checkable
class RuntimeDriver(ResourceDriver, Protocol):
    """Runs one tenant's instance (``ensure`` starts it, ``observe`` health-checks it, ``delete`` removes it)."""

    capabilities: ClassVar[frozenset[Capability]]
    # The kind of operator release (``ReleaseArtifact``) the instances it starts run; "" where it starts none.
    release_artifact: ClassVar[str]

    def present(self, spec: TenantSpec) -> bool:
        """Capability.PRESENT: is a process (or pod) of the instance there, healthy or not?"""
        raise CapabilityUnsupported(self, Capability.PRESENT)

    def stop(self, spec: TenantSpec, *, grace_s: float) -> bool | None:
        """Capability.STOP: ask the instance to stop, wait up to ``grace_s``, then force it. True: it exited
        cleanly; None: unknown (the platform stopped it)."""
        raise CapabilityUnsupported(self, Capability.STOP)

    def sleep(self, spec: TenantSpec, *, grace_s: float) -> bool | None:
        """Capability.SLEEP: stop and stay stopped until the next ``ensure`` (what ``stop`` is not on a
        platform that restarts a stopped pod)."""
        raise CapabilityUnsupported(self, Capability.SLEEP)

    def publish_branding(self, spec: TenantSpec, theme: dict[str, Any]) -> str:
        """Capability.PUBLISH_BRANDING: hand the instance ``theme``; returns the content hash it stored."""
        raise CapabilityUnsupported(self, Capability.PUBLISH_BRANDING)


@runtime_checkable
class ObjectStoreDriver(ResourceDriver, Protocol):
    """A tenant's object-store prefix, and the control plane's archives outside every prefix (every store has
    them: recovery and archive expiry depend on it)."""

    capabilities: ClassVar[frozenset[Capability]]

    def archives(self) -> ArchiveStore:
        """The one archive store of this object store (``schema_archive`` and ``archive_expiry`` use it)."""
        ...

    def bytes_used(self, spec: TenantSpec) -> int:
        """Capability.MEASURE_BYTES: the bytes stored under the tenant's prefix now (its listing's sizes)."""
        raise CapabilityUnsupported(self, Capability.MEASURE_BYTES)


@runtime_checkable
class DatabaseDriver(ResourceDriver, Protocol):
    """A tenant's PostgreSQL schema and its LOGIN role."""

    capabilities: ClassVar[frozenset[Capability]]


@runtime_checkable
class VolumeDriver(ResourceDriver, Protocol):
    """A tenant's working-files volume."""

    capabilities: ClassVar[frozenset[Capability]]

    def bytes_used(self, spec: TenantSpec) -> int:
        """Capability.MEASURE_BYTES: the bytes of the files in the tenant's volume now."""
        raise CapabilityUnsupported(self, Capability.MEASURE_BYTES)
