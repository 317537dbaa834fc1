"""Rotation in process: KEK re-wrap, data-key re-encryption, object keys, idempotency, failures, admin."""

from __future__ import annotations

import pytest

from controlplane.errors import DecryptionFailed
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tests.vault.test_vault_helpers import make_tenant, ring_add_version
from vault.choices import KeyPurpose
from vault.envelope import object_aad, open_sealed, seal
from vault.models import CredentialVersion, RotationJob, TenantDataKey
from vault.rotation import data_key_rotate_start, kek_rotate_start, rotation_job_execute, rotation_job_resume
from vault.selectors import kek_ids_in_use
from vault.services import credential_put, credential_reveal, tenant_object_key, tenant_object_keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def populated(operator):  # type: ignore[no-untyped-def]
    """Three tenants, each with credentials (two with two versions) and an object key."""
    values = {}
    tenants = [make_tenant(operator) for _ in range(3)]
    for t in tenants:
        for i in range(3):
            name = f"cred-{i}"
            credential_put(tenant=t, name=name, value=f"old-{t.pk}-{i}", actor=SYSTEM)
            values[(t.pk, name)] = f"old-{t.pk}-{i}"
            if i < 2:
                credential_put(tenant=t, name=name, value=f"val-{t.pk}-{i}", actor=SYSTEM)
                values[(t.pk, name)] = f"val-{t.pk}-{i}"
        tenant_object_key(tenant=t)
    return tenants, values


def assert_all_decrypt(tenants, values) -> None:  # type: ignore[no-untyped-def]
    for t in tenants:
        for i in range(3):
            value = credential_reveal(tenant=t, name=f"cred-{i}", actor=SYSTEM, audit=False)
            assert value == values[(t.pk, f"cred-{i}")]


def test_kek_rotation_rewraps_every_data_key_and_touches_no_credential(populated, settings):
    tenants, values = populated
    ciphertexts = dict(CredentialVersion.objects.values_list("id", "ciphertext"))
    wrapped_before = dict(TenantDataKey.objects.values_list("id", "wrapped_key"))
    old_ring = settings.VAULT_KEK_KEYRING
    settings.VAULT_KEK_KEYRING = ring_add_version(old_ring, "v2")

    job = kek_rotate_start(actor=SYSTEM)
    assert job.kind == "kek" and job.target == "local:v2" and job.total == len(wrapped_before) == 6
    assert job.details["replaced_kek_ids"] == ["local:v1"]
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    job.refresh_from_db()
    assert job.status == "succeeded" and job.done == job.total and job.finished_at

    assert kek_ids_in_use() == ["local:v2"]
    wrapped_after = dict(TenantDataKey.objects.values_list("id", "wrapped_key"))
    assert all(bytes(w) != bytes(wrapped_before[pk]) for pk, w in wrapped_after.items())
    assert {pk: bytes(c) for pk, c in CredentialVersion.objects.values_list("id", "ciphertext")} == {
        pk: bytes(c) for pk, c in ciphertexts.items()}
    # v1 is no longer needed: a ring without it still opens everything.
    settings.VAULT_KEK_KEYRING = settings.VAULT_KEK_KEYRING.split(",", 1)[1]
    assert_all_decrypt(tenants, values)
    finish = AuditLog.objects.get(action="vault.kek_rotation.finish")
    assert finish.data["kek_ids_in_use"] == ["local:v2"]


def test_data_key_rotation_reencrypts_then_retires_the_old_version(populated):
    tenants, values = populated
    tenant, other = tenants[0], tenants[1]
    other_rows = dict(CredentialVersion.objects.filter(credential__tenant=other).values_list("id", "ciphertext"))

    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    assert job.target == "2" and job.total == 5
    # From the start on, new writes use the new version; both versions are active until the end.
    credential_put(tenant=tenant, name="written-during", value="during", actor=SYSTEM)
    assert CredentialVersion.objects.get(credential__name="written-during").data_key_version == 2
    assert rotation_job_execute(str(job.pk)) == "succeeded"

    rows = CredentialVersion.objects.filter(credential__tenant=tenant)
    assert set(rows.values_list("data_key_version", flat=True)) == {2}
    keys = TenantDataKey.objects.filter(tenant=tenant, purpose=KeyPurpose.CREDENTIALS).order_by("version")
    assert [(k.version, k.status) for k in keys] == [(1, "retired"), (2, "active")]
    assert keys[0].retired_at is not None
    assert_all_decrypt(tenants, values)
    assert credential_reveal(tenant=tenant, name="written-during", actor=SYSTEM, audit=False) == "during"
    # Other tenants are untouched.
    assert {pk: bytes(c) for pk, c in CredentialVersion.objects.filter(credential__tenant=other)
            .values_list("id", "ciphertext")} == {pk: bytes(c) for pk, c in other_rows.items()}
    job.refresh_from_db()
    assert job.details["retired_versions"] == [1]
    assert job.done == 5  # counted once per credential version present at the start


def test_start_is_idempotent_and_a_finished_job_is_a_no_op(populated):
    tenant = populated[0][0]
    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    assert data_key_rotate_start(tenant=tenant, actor=SYSTEM).pk == job.pk
    assert TenantDataKey.objects.filter(tenant=tenant, purpose="credentials").count() == 2
    kek_job = kek_rotate_start(actor=SYSTEM)
    assert kek_rotate_start(actor=SYSTEM).pk == kek_job.pk
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    assert rotation_job_execute(str(job.pk)) == "finished"
    assert rotation_job_execute(str(kek_job.pk)) == "succeeded"
    assert RotationJob.objects.count() == 2
    # A second rotation after the first finished makes version 3 and retires 2.
    job3 = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    assert job3.pk != job.pk and job3.target == "3"
    assert rotation_job_execute(str(job3.pk)) == "succeeded"
    assert list(TenantDataKey.objects.filter(tenant=tenant, purpose="credentials", status="active")
                .values_list("version", flat=True)) == [3]
    assert_all_decrypt(*populated)


def test_resume_after_partial_progress_redoes_nothing(populated):
    """Units before the cursor are skipped; units after it that are already done are detected by their
    data-key version and not redone (their ciphertext does not change)."""
    tenants, values = populated
    tenant = tenants[0]
    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    rows = list(CredentialVersion.objects.filter(credential__tenant=tenant).order_by("id"))
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    after = {r.pk: bytes(r.ciphertext) for r in CredentialVersion.objects.filter(credential__tenant=tenant)}
    # Pretend a worker died right after committing the third unit: rewind the job to that point.
    RotationJob.objects.filter(pk=job.pk).update(status="running", cursor=rows[2].pk, done=3, finished_at=None)
    TenantDataKey.objects.filter(tenant=tenant, version=1, purpose="credentials").update(status="active")
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    assert {r.pk: bytes(r.ciphertext) for r in CredentialVersion.objects.filter(credential__tenant=tenant)} == after
    job.refresh_from_db()
    assert job.done == 3  # nothing was left to do past the cursor
    assert TenantDataKey.objects.get(tenant=tenant, version=1, purpose="credentials").status == "retired"
    assert_all_decrypt(tenants, values)


def test_a_tampered_credential_fails_the_job_loudly_without_values(populated):
    tenants, _ = populated
    tenant = tenants[0]
    row = CredentialVersion.objects.filter(credential__tenant=tenant, credential__name="cred-1").first()
    blob = bytearray(bytes(row.ciphertext))
    blob[-1] ^= 1
    CredentialVersion.objects.filter(pk=row.pk).update(ciphertext=bytes(blob))
    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "failed"
    job.refresh_from_db()
    assert job.status == "failed" and "cred-1" in job.error and "val-" not in job.error
    # Nothing retired: the old version still opens the untouched credentials.
    assert TenantDataKey.objects.get(tenant=tenant, purpose="credentials", version=1).status == "active"
    assert credential_reveal(tenant=tenant, name="cred-0", actor=SYSTEM, audit=False) == f"val-{tenant.pk}-0"
    with pytest.raises(DecryptionFailed):
        credential_reveal(tenant=tenant, name="cred-1", actor=SYSTEM, audit=False)
    # Once fixed (a new value written), the same job can be retried to completion.
    credential_put(tenant=tenant, name="cred-1", value="fixed", actor=SYSTEM)
    CredentialVersion.objects.filter(pk=row.pk).delete()
    rotation_job_resume(job=job, actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    assert credential_reveal(tenant=tenant, name="cred-1", actor=SYSTEM, audit=False) == "fixed"


def test_kek_job_refuses_to_run_against_a_changed_key_ring(populated, settings):
    settings.VAULT_KEK_KEYRING = ring_add_version(settings.VAULT_KEK_KEYRING, "v2")
    job = kek_rotate_start(actor=SYSTEM)
    settings.VAULT_KEK_KEYRING = ring_add_version(settings.VAULT_KEK_KEYRING, "v3")
    assert rotation_job_execute(str(job.pk)) == "failed"
    job.refresh_from_db()
    assert "local:v3" in job.error
    assert kek_ids_in_use() == ["local:v1"]
    assert_all_decrypt(*populated)


def test_object_key_rotation_keeps_old_objects_readable(operator):
    tenant = make_tenant(operator)
    old_key = tenant_object_key(tenant=tenant)
    old_blob = seal(old_key, b"snapshot-1", object_aad(str(tenant.pk), "snapshots/1"))
    job = data_key_rotate_start(tenant=tenant, purpose=KeyPurpose.OBJECTS, actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    new_key = tenant_object_key(tenant=tenant)
    assert new_key != old_key
    keys = tenant_object_keys(tenant=tenant)
    assert [(k.version, k.status) for k in keys] == [(2, "active"), (1, "retired")]
    assert open_sealed(keys[1].key, old_blob, object_aad(str(tenant.pk), "snapshots/1")) == b"snapshot-1"
    assert "key=" not in repr(keys[0]) and repr(old_key) not in repr(keys)


def test_deleted_tenant_cannot_rotate(operator):
    from controlplane.errors import Conflict

    tenant = make_tenant(operator, status="deleted")
    with pytest.raises(Conflict):
        data_key_rotate_start(tenant=tenant, actor=SYSTEM)


def test_admin_shows_metadata_never_values_and_triggers_rotation(populated, client, django_user_model):
    tenants, values = populated
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw-long-enough-123")
    client.force_login(staff)
    key = TenantDataKey.objects.filter(tenant=tenants[0], purpose="credentials").first()
    credential = tenants[0].credentials.get(name="cred-0")
    pages = [
        "/admin/vault/tenantdatakey/", f"/admin/vault/tenantdatakey/{key.pk}/change/",
        "/admin/vault/credential/", f"/admin/vault/credential/{credential.pk}/change/",
        "/admin/vault/rotationjob/",
    ]
    secrets_ = [v.encode() for v in values.values()]
    wrapped = [bytes(w) for w in TenantDataKey.objects.values_list("wrapped_key", flat=True)]
    for page in pages:
        resp = client.get(page)
        assert resp.status_code == 200, page
        assert not any(s in resp.content for s in secrets_), page
        assert not any(w.hex().encode() in resp.content or repr(w).encode() in resp.content for w in wrapped)
        assert b"ciphertext" not in resp.content.lower() and b"wrapped_key" not in resp.content
    resp = client.post("/admin/vault/tenantdatakey/", {"action": "rotate_data_key", "_selected_action": [key.pk]})
    assert resp.status_code == 302
    job = RotationJob.objects.get(kind="data_key")
    assert job.tenant_id == tenants[0].pk and job.requested_by == "root"
    resp = client.post("/admin/vault/tenantdatakey/",
                       {"action": "rewrap_all_under_newest_kek", "_selected_action": [key.pk]})
    assert resp.status_code == 302 and RotationJob.objects.filter(kind="kek").count() == 1
    resp = client.get(f"/admin/vault/rotationjob/{job.pk}/change/")
    assert resp.status_code == 200
