"""Which driver handles which resource kind, by ``PROVISIONING_PROFILE``.

``runtime_driver()``, ``objectstore_driver()`` and ``database_driver()`` hand out a driver typed by its kind's
Protocol (``protocols``), so a caller tests a declared capability instead of probing the object.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from controlplane.errors import ApplicationError

from ..choices import ResourceKind
from .base import ResourceDriver
from .deferred_runtime import DeferredRuntimeDriver
from .local_objectstore import LocalObjectStoreDriver
from .local_process import LocalProcessDriver
from .local_volume import LocalVolumeDriver
from .postgres_schema import PostgresSchemaDriver
from .protocols import DatabaseDriver, ObjectStoreDriver, RuntimeDriver, VolumeDriver

__all__ = ["ProfileDrivers", "drivers_for_profile", "driver_for", "runtime_driver", "objectstore_driver",
           "database_driver", "runtime_release_artifact", "volume_driver"]


@dataclass(frozen=True)
class ProfileDrivers:
    """One driver per resource kind, each typed by its kind's Protocol."""

    database: DatabaseDriver
    volume: VolumeDriver
    objectstore: ObjectStoreDriver
    runtime: RuntimeDriver

    def by_kind(self) -> dict[str, ResourceDriver]:
        return {ResourceKind.DATABASE: self.database, ResourceKind.VOLUME: self.volume,
                ResourceKind.OBJECTSTORE: self.objectstore, ResourceKind.RUNTIME: self.runtime}


def _profile_drivers(profile: str) -> ProfileDrivers:
    if profile == "local":
        return ProfileDrivers(database=PostgresSchemaDriver(), volume=LocalVolumeDriver(),
                              objectstore=LocalObjectStoreDriver(), runtime=LocalProcessDriver())
    if profile == "kubernetes":
        from .k8s_runtime import K8sRuntimeDriver
        from .k8s_volume import K8sVolumeDriver
        from .s3_objectstore import S3ObjectStoreDriver

        return ProfileDrivers(database=PostgresSchemaDriver(), volume=K8sVolumeDriver(),
                              objectstore=S3ObjectStoreDriver(), runtime=K8sRuntimeDriver())
    raise ApplicationError(f"unknown PROVISIONING_PROFILE {profile!r} (available: local, kubernetes)")


def _configured(profile: str | None = None) -> ProfileDrivers:
    drivers = _profile_drivers(profile or settings.PROVISIONING_PROFILE)
    if settings.PROVISIONING_RUNTIME_DRIVER == "deferred":
        return ProfileDrivers(database=drivers.database, volume=drivers.volume, objectstore=drivers.objectstore,
                              runtime=DeferredRuntimeDriver())
    if settings.PROVISIONING_RUNTIME_DRIVER:
        raise ApplicationError("PROVISIONING_RUNTIME_DRIVER must be empty (the profile's) or 'deferred'")
    return drivers


def drivers_for_profile(profile: str | None = None) -> dict[str, ResourceDriver]:
    return _configured(profile).by_kind()


def driver_for(kind: str) -> ResourceDriver:
    return drivers_for_profile()[kind]


def runtime_driver() -> RuntimeDriver:
    return _configured().runtime


def objectstore_driver() -> ObjectStoreDriver:
    return _configured().objectstore


def database_driver() -> DatabaseDriver:
    return _configured().database


def volume_driver() -> VolumeDriver:
    return _configured().volume


def runtime_release_artifact(profile: str | None = None) -> str:
    """The kind of release (``ReleaseArtifact``) the profile's instances run. The profile's own runtime driver
    decides, also under ``PROVISIONING_RUNTIME_DRIVER=deferred``: that defers the start, not what starts."""
    return _profile_drivers(profile or settings.PROVISIONING_PROFILE).runtime.release_artifact
