"""Which driver handles which resource kind, by ``PROVISIONING_PROFILE``."""

from __future__ import annotations

from django.conf import settings

from controlplane.errors import ApplicationError

from ..choices import ResourceKind
from .base import ResourceDriver
from .deferred_runtime import DeferredRuntimeDriver
from .local_objectstore import LocalObjectStoreDriver
from .local_process import LocalProcessDriver
from .local_volume import LocalVolumeDriver
from .postgres_schema import PostgresSchemaDriver

__all__ = ["drivers_for_profile", "driver_for", "runtime_release_artifact"]


def _profile_drivers(profile: str) -> dict[str, ResourceDriver]:
    if profile == "local":
        return {
            ResourceKind.DATABASE: PostgresSchemaDriver(),
            ResourceKind.VOLUME: LocalVolumeDriver(),
            ResourceKind.OBJECTSTORE: LocalObjectStoreDriver(),
            ResourceKind.RUNTIME: LocalProcessDriver(),
        }
    if profile == "kubernetes":
        from .k8s_runtime import K8sRuntimeDriver
        from .k8s_volume import K8sVolumeDriver
        from .s3_objectstore import S3ObjectStoreDriver

        return {
            ResourceKind.DATABASE: PostgresSchemaDriver(),
            ResourceKind.VOLUME: K8sVolumeDriver(),
            ResourceKind.OBJECTSTORE: S3ObjectStoreDriver(),
            ResourceKind.RUNTIME: K8sRuntimeDriver(),
        }
    raise ApplicationError(f"unknown PROVISIONING_PROFILE {profile!r} (available: local, kubernetes)")


def drivers_for_profile(profile: str | None = None) -> dict[str, ResourceDriver]:
    drivers = _profile_drivers(profile or settings.PROVISIONING_PROFILE)
    if settings.PROVISIONING_RUNTIME_DRIVER == "deferred":
        drivers[ResourceKind.RUNTIME] = DeferredRuntimeDriver()
    elif settings.PROVISIONING_RUNTIME_DRIVER:
        raise ApplicationError("PROVISIONING_RUNTIME_DRIVER must be empty (the profile's) or 'deferred'")
    return drivers


def driver_for(kind: str) -> ResourceDriver:
    return drivers_for_profile()[kind]


def runtime_release_artifact(profile: str | None = None) -> str:
    """The kind of release (``ReleaseArtifact``) the profile's instances run. The profile's own runtime driver
    decides, also under ``PROVISIONING_RUNTIME_DRIVER=deferred``: that defers the start, not what starts."""
    runtime = _profile_drivers(profile or settings.PROVISIONING_PROFILE)[ResourceKind.RUNTIME]
    return str(getattr(runtime, "release_artifact"))  # noqa: B009 - not on the ResourceDriver protocol
