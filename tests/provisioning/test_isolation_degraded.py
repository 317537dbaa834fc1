"""Issue 15: where the sandbox is impossible the instance still starts, and everyone is told.

An instance started without its own user and sandbox is recorded ``isolation: degraded`` (with
the reason) on its runtime resource; the dashboard shows it, the posture lists it and
``check --deploy`` warns; where isolation is required (``LOCAL_INSTANCE_ISOLATION=required`` or
production) provisioning refuses instead of running weakly.
"""

from __future__ import annotations

import os
import secrets

import psutil
import pytest

from controlplane.errors import ProvisioningError
from tests.conftest import Worker, wait_for

pytestmark = pytest.mark.django_db


def _spec() -> object:
    from provisioning.drivers.base import TenantSpec

    return TenantSpec(tenant_id=f"deg-{secrets.token_hex(4)}", resource_name="t_deg", operator_slug="deg")


def test_not_root_gives_degraded_isolation_with_the_reason(settings, monkeypatch):
    from provisioning.drivers.local_sandbox import DEGRADED, ensure_instance_user

    settings.LOCAL_INSTANCE_ISOLATION = "auto"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the process's identity, as the kernel would report it
    isolation = ensure_instance_user(_spec())
    assert isolation.mode == DEGRADED and "does not run as root" in isolation.reason
    assert isolation.as_details() == {"isolation": "degraded", "isolation_reason": isolation.reason}


@pytest.mark.parametrize("how", ["required", "production"])
def test_required_isolation_refuses_instead_of_degrading(settings, monkeypatch, how):
    from provisioning.drivers.local_sandbox import ensure_instance_user

    settings.LOCAL_INSTANCE_ISOLATION = "required" if how == "required" else "auto"
    settings.PRODUCTION = how == "production"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ProvisioningError, match="isolation is required but impossible here: the control plane "
                                                "does not run as root"):
        ensure_instance_user(_spec())


def test_posture_and_check_deploy_say_degraded_when_sandboxing_is_off(settings):
    from provisioning.checks import isolation_posture_check
    from provisioning.fleet.posture import isolation_posture

    settings.LOCAL_INSTANCE_ISOLATION = "off"
    lines = {line.boundary: line for line in isolation_posture()}
    assert lines["OS identity"].status == "degraded" and "LOCAL_INSTANCE_ISOLATION=off" in lines["OS identity"].detail
    assert lines["sandbox"].status == "degraded" and "bubblewrap" in lines["sandbox"].fix
    ids = {m.id for m in isolation_posture_check()}
    assert {"provisioning.W101", "provisioning.W102"} <= ids


@pytest.mark.django_db(transaction=True)  # the worker must see the committed tenant
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: otherwise every instance is degraded anyway")
def test_an_instance_started_unsandboxed_is_marked_and_listed(api, admin_client):
    from provisioning.drivers.local_process import live_host_pid
    from provisioning.fleet.posture import isolation_posture
    from provisioning.models import ProvisionedResource
    from provisioning.resources.spec import tenant_spec
    from tenants.models import Tenant

    worker = Worker(LOCAL_INSTANCE_ISOLATION="off")
    try:
        resp = api.post("/api/v1/tenants", data={"slug": "unsandboxed", "name": "Unsandboxed",
                                                  "allow_no_release": True}, format="json")
        assert resp.status_code == 202, resp.content
        tenant_id = resp.json()["id"]
        wait_for(lambda: Tenant.objects.get(pk=tenant_id).status in ("ready", "failed"), timeout=120,
                 what="tenant ready")
        tenant = Tenant.objects.get(pk=tenant_id)
        assert tenant.status == "ready", (tenant.status_reason, worker.log()[-2000:])
    finally:
        worker.stop()
    runtime = ProvisionedResource.objects.get(tenant=tenant, kind="runtime")
    assert runtime.details["isolation"] == "degraded"
    assert runtime.details["isolation_reason"] == "LOCAL_INSTANCE_ISOLATION=off"
    assert psutil.Process(live_host_pid(tenant_spec(tenant))).uids().real == os.geteuid()  # the shared user
    # This process can sandbox: the posture names the instance that is not.
    identity = next(line for line in isolation_posture() if line.boundary == "OS identity")
    assert identity.status == "degraded" and "unsandboxed" in identity.detail
    page = admin_client.get(f"/dashboard/tenants/{tenant_id}/").content.decode()
    assert 'data-testid="tenant-isolation">degraded<' in page and "LOCAL_INSTANCE_ISOLATION=off" in page
    # The suite's server trusts local logins, so this tenant was provisioned with the override: shown as such.
    assert 'data-testid="database-auth">insecure' in page and "trust" in page
    posture_page = admin_client.get("/dashboard/isolation/").content.decode()
    assert 'data-boundary="OS identity"' in posture_page and "unsandboxed" in posture_page
    # Starting it from here (where sandboxing is on) reuses the live host and says what it really runs as.
    from provisioning.fleet.instances import instance_start
    from tenants.actors import SYSTEM

    details = instance_start(tenant=tenant, actor=SYSTEM)
    assert details["isolation"] == "degraded" and "since before its sandbox" in details["isolation_reason"]
