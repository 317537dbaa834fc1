"""Drivers declare what they can do; nothing probes them (issue 36).

Every driver subclasses its kind's Protocol (provisioning/drivers/protocols.py) and lists its ``capabilities``;
a capability method it does not list raises ``CapabilityUnsupported``. These tests hold each driver to its
declaration, check the signatures against the Protocols with mypy, and fail if a ``hasattr``/``getattr``
probe on a driver comes back anywhere in the control plane.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import provisioning.drivers
from provisioning.drivers.archives import ArchiveStore
from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.deferred_runtime import DeferredRuntimeDriver
from provisioning.drivers.k8s_runtime import K8sRuntimeDriver
from provisioning.drivers.k8s_volume import K8sVolumeDriver
from provisioning.drivers.local_objectstore import LocalArchives, LocalObjectStoreDriver
from provisioning.drivers.local_process import LocalProcessDriver
from provisioning.drivers.local_volume import LocalVolumeDriver
from provisioning.drivers.postgres_schema import PostgresSchemaDriver
from provisioning.drivers.protocols import (
    RUNTIME_CAPABILITY_METHODS,
    Capability,
    CapabilityUnsupported,
    DatabaseDriver,
    ObjectStoreDriver,
    RuntimeDriver,
    VolumeDriver,
)
from provisioning.drivers.registry import _profile_drivers
from provisioning.drivers.s3_objectstore import S3Archives, S3ObjectStoreDriver
from tests import source_ast

ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ["controlplane", "tenants", "vault", "provisioning", "dashboard", "portal", "branding",
                 "conversations", "webhooks", "releases", "instances", "schedules"]
KIND_PROTOCOLS = (RuntimeDriver, ObjectStoreDriver, DatabaseDriver, VolumeDriver)
RUNTIME_DRIVERS = [LocalProcessDriver, K8sRuntimeDriver, DeferredRuntimeDriver]
OTHER_DRIVERS = [LocalObjectStoreDriver, S3ObjectStoreDriver, PostgresSchemaDriver, LocalVolumeDriver,
                 K8sVolumeDriver]
SPEC = TenantSpec(tenant_id=TenantId("00000000-0000-0000-0000-000000000000"), resource_name="t_0",
                  operator_slug="acme")

# --- no probes ---------------------------------------------------------------------------------------------

# Every member a driver Protocol declares, old or new: probing for one of them is probing a driver.
_DRIVER_MEMBERS = {"present", "stop", "sleep", "publish_branding", "rolls_out_itself", "release_artifact",
                   "capabilities", "archives", "put_archive", "get_archive", "ensure", "observe"}
_DRIVER_OBJECT = re.compile(r"driver|objectstore|runtime|store\b", re.IGNORECASE)


def driver_probes(source: str, filename: str = "<source>") -> list[str]:
    """``hasattr``/``getattr`` calls that ask a driver object what it has: the object's expression names a driver
    (``driver``, ``store``, ``runtime``, ``driver_for(...)``) or the attribute is a driver Protocol member."""
    found = []
    for node in ast.walk(source_ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2):
            continue
        obj, attr = node.args[0], node.args[1]
        member = attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else None
        if _DRIVER_OBJECT.search(ast.unparse(obj)) or member in _DRIVER_MEMBERS:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("probe", [
    'stop = getattr(driver, "stop", None)',
    'sleep = getattr(driver_for(ResourceKind.RUNTIME), "sleep", None)',
    'if hasattr(store, "get_archive"): pass',
    'flag = getattr(driver_for(ResourceKind.RUNTIME), "rolls_out_itself", False)',
    'return str(getattr(runtime, "release_artifact"))',
    'name = getattr(deployment.driver_object, "name", "")',
    'x = hasattr(thing, "present")',
])
def test_the_scan_sees_a_probe(probe):
    assert driver_probes(probe)


def test_the_scan_leaves_other_getattrs_alone():
    assert driver_probes('getattr(request, "user", None); getattr(settings, name, ""); hasattr(exc, "detail")') == []


def test_no_driver_is_probed_in_the_control_plane():
    probes = []
    for package in CONTROL_PLANE:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or "tests" in path.parts:
                continue
            probes += driver_probes(path.read_text(), str(path.relative_to(ROOT)))
    assert probes == [], "test the driver's declared capabilities instead:\n" + "\n".join(probes)


# --- declared == implemented -------------------------------------------------------------------------------


def test_every_driver_class_subclasses_its_kinds_protocol():
    classes = {}
    for info in pkgutil.iter_modules(provisioning.drivers.__path__):
        module = importlib.import_module(f"provisioning.drivers.{info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and value.__module__ == module.__name__ and value.__name__.endswith("Driver")
                    and not value.__dict__.get("_is_protocol", False)):  # the Protocols themselves
                classes[value.__name__] = value
    assert set(classes) == {c.__name__ for c in RUNTIME_DRIVERS + OTHER_DRIVERS}, "list a new driver here"
    for cls in classes.values():
        kinds = [p for p in KIND_PROTOCOLS if p in cls.__mro__]
        assert len(kinds) == 1, f"{cls.__name__} must subclass exactly one of {KIND_PROTOCOLS}"
        assert isinstance(cls(), kinds[0])  # runtime_checkable: every member is there
        assert isinstance(cls.capabilities, frozenset)
        assert all(isinstance(c, Capability) for c in cls.capabilities)


@pytest.mark.parametrize("cls", RUNTIME_DRIVERS, ids=lambda c: c.__name__)
def test_a_runtime_driver_declares_exactly_what_it_implements(cls):
    for capability, method in RUNTIME_CAPABILITY_METHODS.items():
        implemented = getattr(cls, method) is not getattr(RuntimeDriver, method)
        assert (capability in cls.capabilities) == implemented, (
            f"{cls.__name__}.{method}: declared {capability in cls.capabilities}, implemented {implemented}")


@pytest.mark.parametrize("cls", RUNTIME_DRIVERS, ids=lambda c: c.__name__)
def test_an_undeclared_capability_fails_loudly(cls):
    calls = {
        Capability.PRESENT: lambda d: d.present(SPEC),
        Capability.STOP: lambda d: d.stop(SPEC, grace_s=0),
        Capability.SLEEP: lambda d: d.sleep(SPEC, grace_s=0),
        Capability.PUBLISH_BRANDING: lambda d: d.publish_branding(SPEC, {}),
    }
    assert set(calls) == set(RUNTIME_CAPABILITY_METHODS)
    for capability in set(calls) - cls.capabilities:
        with pytest.raises(CapabilityUnsupported, match=capability.value):
            calls[capability](cls())


def test_the_declarations_the_callers_rely_on():
    """The table in docs/architecture.md, and what each difference means for the callers."""
    assert LocalProcessDriver.capabilities == {Capability.PRESENT, Capability.STOP, Capability.SLEEP,
                                               Capability.PUBLISH_BRANDING}
    # Kubernetes: a release switch must not delete the pod first; scale to zero is its sleep.
    assert K8sRuntimeDriver.capabilities == {Capability.STOP, Capability.SLEEP, Capability.PUBLISH_BRANDING,
                                             Capability.ROLLS_OUT_ITSELF}
    assert DeferredRuntimeDriver.capabilities == {Capability.PUBLISH_BRANDING}
    # Usage metering measures storage where a listing or a walk can (a PVC's usage is not in the Kubernetes API).
    for cls in (LocalObjectStoreDriver, S3ObjectStoreDriver, LocalVolumeDriver):
        assert cls.capabilities == {Capability.MEASURE_BYTES}, cls.__name__
    for cls in (PostgresSchemaDriver, K8sVolumeDriver):
        assert cls.capabilities == frozenset(), cls.__name__
    with pytest.raises(CapabilityUnsupported, match="measure_bytes"):
        K8sVolumeDriver().bytes_used(SPEC)


@pytest.mark.parametrize("profile", ["local", "kubernetes"])
def test_each_profile_hands_out_drivers_of_their_kinds(profile):
    drivers = _profile_drivers(profile)
    assert isinstance(drivers.runtime, RuntimeDriver)
    assert isinstance(drivers.objectstore, ObjectStoreDriver)
    assert isinstance(drivers.database, DatabaseDriver)
    assert isinstance(drivers.volume, VolumeDriver)
    assert drivers.runtime.release_artifact  # the profile's own runtime says what its releases are


def test_one_archive_store_per_object_store(settings, tmp_path):
    settings.LOCAL_OBJECTSTORE_ROOT = str(tmp_path)
    settings.S3_BUCKET = "archives-test"
    assert isinstance(LocalObjectStoreDriver().archives(), LocalArchives)
    assert isinstance(S3ObjectStoreDriver().archives(), S3Archives)
    for store in (LocalObjectStoreDriver().archives(), S3ObjectStoreDriver().archives()):
        assert isinstance(store, ArchiveStore)


def test_driver_signatures_match_their_protocols_for_mypy():
    """Static half of the conformance: a driver method whose signature differs from its Protocol's (an
    incompatible override) is a mypy error here, even though mypy's gate does not cover the whole control plane."""
    files = [str(ROOT / "provisioning" / "drivers" / f"{m.name}.py")
             for m in pkgutil.iter_modules(provisioning.drivers.__path__)]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
         "--hide-error-context", "--show-error-codes", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    conformance = [line for line in result.stdout.splitlines()
                   if "[override]" in line or "[abstract]" in line or "Protocol" in line or "supertype" in line]
    assert conformance == [], "\n".join(conformance)
