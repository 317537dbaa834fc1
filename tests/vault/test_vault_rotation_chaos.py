"""Rotation in real Celery workers, killed with SIGKILL midway, then resumed by a fresh worker."""

from __future__ import annotations

import signal

import pytest

from tenants.actors import SYSTEM
from tests.conftest import wait_for
from tests.vault.test_vault_helpers import make_tenant, ring_add_version
from vault.models import CredentialVersion, RotationJob, TenantDataKey
from vault.rotation import data_key_rotate_start, kek_rotate_start
from vault.selectors import kek_ids_in_use
from vault.services import credential_put, credential_reveal, tenant_object_key

pytestmark = pytest.mark.django_db(transaction=True)

PAUSE = "0.4"


def _populate(operator, tenants: int, per_tenant: int) -> dict:  # type: ignore[no-untyped-def]
    values = {}
    for _ in range(tenants):
        tenant = make_tenant(operator)
        for i in range(per_tenant):
            value = f"chaos-{tenant.pk.hex[:8]}-{i}"
            credential_put(tenant=tenant, name=f"cred-{i}", value=value, actor=SYSTEM)
            values[(tenant, f"cred-{i}")] = value
        tenant_object_key(tenant=tenant)
    return values


def _assert_all_decrypt(values: dict) -> None:
    for (tenant, name), value in values.items():
        assert credential_reveal(tenant=tenant, name=name, actor=SYSTEM, audit=False) == value


def _job(job_id: object) -> RotationJob:
    return RotationJob.objects.get(pk=job_id)


def _kill_midway(worker, job_id: object, at_least: int) -> RotationJob:  # type: ignore[no-untyped-def]
    wait_for(lambda: _job(job_id).done >= at_least, timeout=90, what="rotation progress")
    worker.kill(signal.SIGKILL)
    assert worker.proc.returncode == -signal.SIGKILL
    job = _job(job_id)
    assert job.status == "running" and at_least <= job.done < job.total, (job.done, job.total)
    return job


def test_kek_rotation_survives_sigkill(operator, worker_factory, settings):
    values = _populate(operator, tenants=5, per_tenant=2)  # 10 data keys (credentials + objects)
    settings.VAULT_KEK_KEYRING = ring_add_version(settings.VAULT_KEK_KEYRING, "v2")
    first = worker_factory(VAULT_ROTATION_PAUSE_PER_ITEM_S=PAUSE)
    job = kek_rotate_start(actor=SYSTEM)
    assert job.total == 10

    killed = _kill_midway(first, job.pk, at_least=3)
    in_use = set(TenantDataKey.objects.values_list("kek_id", flat=True))
    assert in_use == {"local:v1", "local:v2"}  # really half-way
    _assert_all_decrypt(values)  # no downtime: both wrappings open

    worker_factory()
    assert kek_rotate_start(actor=SYSTEM).pk == job.pk  # re-run resumes the same job
    wait_for(lambda: _job(job.pk).status == "succeeded", timeout=90, what="rotation to finish")
    job = _job(job.pk)
    assert job.done == job.total == 10 and job.cursor >= killed.cursor
    assert kek_ids_in_use() == ["local:v2"]
    settings.VAULT_KEK_KEYRING = settings.VAULT_KEK_KEYRING.split(",", 1)[1]  # drop v1: old version retired
    _assert_all_decrypt(values)


def test_data_key_rotation_survives_sigkill(operator, worker_factory):
    values = _populate(operator, tenants=1, per_tenant=10)
    tenant = next(iter(values))[0]
    first = worker_factory(VAULT_ROTATION_PAUSE_PER_ITEM_S=PAUSE)
    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    assert job.total == 10 and job.target == "2"

    _kill_midway(first, job.pk, at_least=3)
    versions = set(CredentialVersion.objects.filter(credential__tenant=tenant)
                   .values_list("data_key_version", flat=True))
    assert versions == {1, 2}
    _assert_all_decrypt(values)
    # A write during the outage goes to the new version.
    credential_put(tenant=tenant, name="cred-0", value="rewritten", actor=SYSTEM)
    values[(tenant, "cred-0")] = "rewritten"

    worker_factory()
    assert data_key_rotate_start(tenant=tenant, actor=SYSTEM).pk == job.pk
    wait_for(lambda: _job(job.pk).status == "succeeded", timeout=90, what="rotation to finish")
    assert _job(job.pk).done == 10
    assert set(CredentialVersion.objects.filter(credential__tenant=tenant)
               .values_list("data_key_version", flat=True)) == {2}
    keys = TenantDataKey.objects.filter(tenant=tenant, purpose="credentials").order_by("version")
    assert [(k.version, k.status) for k in keys] == [(1, "retired"), (2, "active")]
    _assert_all_decrypt(values)
