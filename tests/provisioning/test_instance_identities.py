"""Identities without /etc/passwd (issue 38): numeric uids from a dedicated range, one per tenant, never reused.

``useradd --system`` capped a machine at ~880 sandboxed tenants (system uids 100-999: tenant 881 failed with
"Can't get unique GID") and reissued a freed uid within minutes, so a new tenant owned what a deprovisioned one
left on disk. Here 2,000 tenants get identities (the step every onboarding's volume runs first), real volumes
are handed to some of them, half are deprovisioned, and new tenants never get a number seen before.
"""

from __future__ import annotations

import os
import pwd
import secrets
import uuid
from pathlib import Path

import pytest

from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.local_sandbox import SANDBOXED, ensure_instance_user, sandbox_support
from provisioning.drivers.local_volume import LocalVolumeDriver

pytestmark = pytest.mark.django_db

TENANTS = 2000


def _spec(tag: str) -> TenantSpec:
    tenant_id = str(uuid.uuid4())
    return TenantSpec(tenant_id=TenantId(tenant_id), resource_name=f"idt-{tag}-{tenant_id[:8]}", operator_slug="op",
                      resources={})


@pytest.fixture
def sandboxing() -> None:
    ok, why = sandbox_support()
    if not ok:
        pytest.skip(f"this machine cannot sandbox instances: {why}")


def test_two_thousand_tenants_get_unique_numeric_identities_never_reused(sandboxing, settings) -> None:  # type: ignore[no-untyped-def]
    tag = secrets.token_hex(3)
    passwd_before = len(pwd.getpwall())
    specs = [_spec(tag) for _ in range(TENANTS)]
    uids = [ensure_instance_user(spec) for spec in specs]
    assert all(i.mode == SANDBOXED and i.uid == i.gid and i.user == "" for i in uids)
    numbers = [i.uid for i in uids]
    assert len(set(numbers)) == TENANTS  # past the ~880 the system range held
    assert min(n for n in numbers if n is not None) >= settings.LOCAL_INSTANCE_UID_BASE
    assert len(pwd.getpwall()) == passwd_before  # no /etc/passwd entries made
    assert [ensure_instance_user(s).uid for s in specs[:50]] == numbers[:50]  # stable per tenant

    # Real volumes for some: owned by the number, mode 0700.
    driver = LocalVolumeDriver()
    kept = specs[:10]
    for spec in kept:
        ref = driver.ensure(spec)
        volume = Path(ref.details["path"])
        assert volume.stat().st_uid == ref.details["os_uid"] and (volume.stat().st_mode & 0o777) == 0o700
    # Half deprovisioned (their volumes deleted, their identities retired); the new tenants' numbers are new.
    for spec in specs[: TENANTS // 2]:
        if spec in kept:
            from provisioning.drivers.base import Ref

            driver.delete(spec, Ref(external_id="", details={}))
        else:
            from provisioning.drivers.local_sandbox import remove_instance_user

            remove_instance_user(spec)
    fresh = [ensure_instance_user(_spec(tag)).uid for _ in range(100)]
    assert not set(fresh) & set(numbers)
    assert min(n for n in fresh if n is not None) > max(n for n in numbers if n is not None)


def test_a_tenant_with_a_system_user_from_before_keeps_it(sandboxing) -> None:  # type: ignore[no-untyped-def]
    """Its files are owned by that uid: switching it to a new number would lock it out of its own volume."""
    import subprocess

    from provisioning.drivers.local_sandbox import instance_user_name, remove_instance_user

    spec = _spec("legacy")
    name = instance_user_name(spec)
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--comment", f"agent instance {spec.resource_name}", name], check=True, capture_output=True)
    try:
        isolation = ensure_instance_user(spec)
        assert isolation.user == name and isolation.uid == pwd.getpwnam(name).pw_uid < 1000
    finally:
        remove_instance_user(spec)
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    assert os.geteuid() == 0


def test_the_posture_counts_the_identities_issued_and_left(sandboxing, settings) -> None:  # type: ignore[no-untyped-def]
    from provisioning.fleet.posture import isolation_posture

    ensure_instance_user(_spec("posture"))
    line = next(x for x in isolation_posture() if x.boundary == "identity range")
    assert line.status == "pass" and f"uids from {settings.LOCAL_INSTANCE_UID_BASE}" in line.detail, line
    settings.LOCAL_INSTANCE_UID_BASE = 500  # among system users: the posture says so
    line = next(x for x in isolation_posture() if x.boundary == "identity range")
    assert line.status == "degraded", line
