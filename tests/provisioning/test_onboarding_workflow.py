"""Onboarding and deprovisioning end to end: REST API -> real Celery worker -> real resources.

The chaos test SIGKILLs the worker while each step in turn has done its external effect
but not yet recorded it, then lets a fresh worker resume: the tenant still reaches
``ready`` and every resource exists exactly once.
"""

from __future__ import annotations

import gzip
import json
import signal
import stat
import time
import urllib.request
from pathlib import Path

import psutil
import psycopg
import pytest
from django.conf import settings
from rest_framework.test import APIClient

from controlplane.jobs import jobs_resume_stalled
from provisioning.choices import StepStatus
from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.models import AgentInstance, ProvisionedResource, WorkflowRun, WorkflowStep
from tenants.models import Tenant
from tests.conftest import wait_for
from vault.choices import DB_PASSWORD_CREDENTIAL
from vault.envelope import object_aad, open_sealed
from vault.models import CredentialVersion, TenantDataKey
from vault.services import tenant_object_key

pytestmark = pytest.mark.django_db(transaction=True)

ONBOARD_STEPS = ["database", "volume", "objectstore", "vault", "runtime", "ready"]


def _status(tenant_id: str) -> str:
    return Tenant.objects.get(pk=tenant_id).status


def _onboard(api: APIClient, slug: str) -> str:
    resp = api.post("/api/v1/tenants", data=json.dumps({"slug": slug, "name": slug.title(), "allow_no_release": True}),
                    content_type="application/json")
    assert resp.status_code == 202, resp.content
    return resp.json()["id"]


def _pg_counts(name: str) -> tuple[int, int]:
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        roles = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0]
        schemas = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,)).fetchone()[0]
    return roles, schemas


def _host_processes(volume: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            # The host itself, not the bwrap/setpriv of its sandbox (their arguments name the module too).
            if (proc.info["cmdline"] or [])[1:3] == ["-m", "agent_runtime.host"] and proc.info["cwd"] == str(volume):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _assert_exactly_once(tenant: Tenant) -> None:
    assert sorted(ProvisionedResource.objects.filter(tenant=tenant).values_list("kind", flat=True)) == sorted(
        ["database", "volume", "objectstore", "vault", "runtime"]
    )
    assert _pg_counts(tenant.resource_name) == (1, 1)
    assert list(TenantDataKey.objects.filter(tenant=tenant).values_list("purpose", "version").order_by("purpose")) \
        == [("credentials", 1), ("objects", 1)]
    passwords = CredentialVersion.objects.filter(credential__tenant=tenant, credential__name=DB_PASSWORD_CREDENTIAL)
    assert passwords.count() == 1
    volume = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name
    assert len(_host_processes(volume)) == 1


def test_onboard_then_deprovision_end_to_end(api, worker_factory):
    worker = worker_factory()
    tenant_id = _onboard(api, "acme-corp")
    wait_for(lambda: _status(tenant_id) in ("ready", "failed"), timeout=90, what="tenant ready")
    tenant = Tenant.objects.get(pk=tenant_id)
    assert tenant.status == "ready", (tenant.status_reason, worker.log()[-3000:])
    _assert_exactly_once(tenant)

    detail = api.get(f"/api/v1/tenants/{tenant_id}").json()
    assert {r["kind"] for r in detail["resources"]} == {"database", "volume", "objectstore", "vault", "runtime"}
    assert detail["instance"]["status"] == "running"
    assert "endpoint" not in detail["instance"]  # a loopback address: the API never shows it
    endpoint = AgentInstance.objects.get(tenant=tenant).endpoint
    with urllib.request.urlopen(endpoint + "/healthz", timeout=5) as resp:
        assert resp.status == 200
    volume = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name
    assert stat.S_IMODE(volume.stat().st_mode) == 0o700

    assert api.delete(f"/api/v1/tenants/{tenant_id}").status_code == 202
    wait_for(lambda: _status(tenant_id) in ("deleted", "failed"), timeout=90, what="tenant deleted")
    tenant.refresh_from_db()
    assert tenant.status == "deleted", (tenant.status_reason, worker.log()[-3000:])
    assert _pg_counts(tenant.resource_name) == (0, 0)
    assert not volume.exists()
    assert not _host_processes(volume)
    # The schema was archived before it was dropped, encrypted with the tenant's (retained) object key.
    database = ProvisionedResource.objects.get(tenant=tenant, kind="database")
    archive = Path(database.details["archive_url"].removeprefix("file://"))
    key = tenant_object_key(tenant=tenant, version=database.details["archive_key_version"])
    sealed = archive.read_bytes()
    sql = gzip.decompress(open_sealed(key, sealed, object_aad(str(tenant.id), f"archives/{archive.name}"))).decode()
    assert f"CREATE SCHEMA {tenant.resource_name}" in sql
    # The same slug can be onboarded again once the first tenant is deleted.
    assert api.post("/api/v1/tenants", data=json.dumps({"slug": "acme-corp", "name": "Acme", "allow_no_release": True}),
                    content_type="application/json").status_code == 202


@pytest.mark.parametrize("step_name", ONBOARD_STEPS)
def test_worker_sigkilled_during_each_step_still_onboards_exactly_once(api, worker_factory, step_name, settings):
    doomed = worker_factory(PROVISIONING_PAUSE_AFTER_EFFECT_S="30", PROVISIONING_PAUSE_STEP=step_name)
    tenant_id = _onboard(api, f"kill-{step_name}")
    run = WorkflowRun.objects.get(tenant_id=tenant_id)

    def step_in_flight() -> bool:
        return WorkflowStep.objects.filter(run=run, name=step_name, status=StepStatus.RUNNING).exists()

    wait_for(step_in_flight, timeout=90, what=f"step {step_name} running")
    # Give the step time to finish its external effect; the worker then pauses before recording it.
    time.sleep(1.5)
    doomed.kill(signal.SIGKILL)
    assert doomed.proc.returncode == -signal.SIGKILL
    assert WorkflowStep.objects.get(run=run, name=step_name).status == StepStatus.RUNNING

    worker_factory()
    settings.WORKFLOW_STALL_AFTER_S = 0
    assert jobs_resume_stalled() >= 1  # the job kernel's one sweep
    wait_for(lambda: WorkflowRun.objects.get(pk=run.pk).status in ("succeeded", "failed"), timeout=90,
             what="onboarding finished after the kill")
    tenant = Tenant.objects.get(pk=tenant_id)
    assert tenant.status == "ready", tenant.status_reason
    _assert_exactly_once(tenant)
    assert WorkflowStep.objects.get(run=run, name=step_name).attempts == 2
