"""Delivery to the instance: its own tenant only, audited, one-time and revocation enforced by the vault."""

from __future__ import annotations

import json

import pytest

from provisioning.models import AgentInstance
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.models import Credential
from vault.services import credential_put, credential_revoke

pytestmark = pytest.mark.django_db

VALUE = "mail-pass-91d2e07c"


@pytest.fixture
def tenant(operator):  # type: ignore[no-untyped-def]
    return make_tenant(operator, "acme")


@pytest.fixture
def instance_client(tenant):  # type: ignore[no-untyped-def]
    return bearer_client(make_instance(tenant))


def test_instance_fetches_its_credential_and_every_access_is_audited(tenant, instance_client):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    for _ in range(2):
        resp = instance_client.get("/internal/v1/credentials/mail")
        assert resp.status_code == 200
        assert resp.json() == {"name": "mail", "version": 1, "value": VALUE}
        assert "no-store" in resp["Cache-Control"]
    rows = AuditLog.objects.filter(action="credential.deliver", tenant=tenant)
    assert rows.count() == 2
    instance = AgentInstance.objects.get(tenant=tenant)
    assert {(r.actor_kind, r.actor_id) for r in rows} == {("instance", str(instance.pk))}
    assert all(VALUE not in json.dumps(r.data) for r in rows)
    assert Credential.objects.get(tenant=tenant, name="mail").last_used_at is not None


def test_new_version_is_delivered_after_put(tenant, instance_client):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    credential_put(tenant=tenant, name="mail", value=VALUE + "-v2", actor=SYSTEM)
    assert instance_client.get("/internal/v1/credentials/mail").json() == {
        "name": "mail", "version": 2, "value": VALUE + "-v2"}


def test_one_time_credential_is_delivered_once(tenant, instance_client):
    credential_put(tenant=tenant, name="otp", value=VALUE, actor=SYSTEM, one_time=True)
    assert instance_client.get("/internal/v1/credentials/otp").json()["value"] == VALUE
    second = instance_client.get("/internal/v1/credentials/otp")
    assert_problem(second, 404)
    assert VALUE.encode() not in second.content
    assert Credential.objects.get(tenant=tenant, name="otp").consumed_at is not None
    assert AuditLog.objects.filter(action="credential.deliver_refused", tenant=tenant,
                                   data__reason="consumed").count() == 1


def test_revoked_credential_never_comes_back(tenant, instance_client):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    assert instance_client.get("/internal/v1/credentials/mail").status_code == 200
    credential_revoke(tenant=tenant, name="mail", actor=SYSTEM)
    # An instance restored from an older checkpoint asks again: the vault decides, not the checkpoint.
    for _ in range(2):
        assert_problem(instance_client.get("/internal/v1/credentials/mail"), 404)
    assert AuditLog.objects.filter(action="credential.deliver_refused", data__reason="revoked").count() == 2


def test_missing_name_is_404_and_audited(tenant, instance_client):
    assert_problem(instance_client.get("/internal/v1/credentials/nothing-here"), 404)
    row = AuditLog.objects.get(action="credential.deliver_refused", tenant=tenant)
    assert row.data == {"name": "nothing-here", "reason": "missing"}


def test_another_tenants_credential_is_not_addressable_and_is_a_security_event(operator, tenant, instance_client):
    other = make_tenant(operator, "globex")
    credential_put(tenant=other, name="only-in-b", value=VALUE, actor=SYSTEM)
    credential_put(tenant=other, name="shared-name", value=VALUE + "-b", actor=SYSTEM)
    credential_put(tenant=tenant, name="shared-name", value="mine", actor=SYSTEM)

    resp = instance_client.get("/internal/v1/credentials/only-in-b")
    assert_problem(resp, 404)
    assert VALUE.encode() not in resp.content and str(other.pk).encode() not in resp.content
    event = AuditLog.objects.get(action="security.cross_tenant_attempt")
    assert event.tenant_id == tenant.pk and event.actor_kind == "instance"
    assert event.data["name"] == "only-in-b" and event.data["owner_tenant_ids"] == [str(other.pk)]
    # The same name in both tenants resolves to the caller's own.
    assert instance_client.get("/internal/v1/credentials/shared-name").json()["value"] == "mine"
    assert not AuditLog.objects.filter(action="credential.deliver", tenant=other).exists()


def test_system_credentials_are_not_delivered(tenant, instance_client):
    resp = instance_client.get("/internal/v1/credentials/system.instance-token")
    assert_problem(resp, 404)
    assert AuditLog.objects.filter(action="credential.deliver_refused", data__reason="reserved").exists()


def test_operator_token_missing_and_wrong_tokens_are_401(tenant, make_token, operator):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    token = make_instance(tenant)
    for header in (None, f"Bearer {make_token(operator)}", "Bearer wrong", f"Bearer {token[:-1]}",
                   f"Token {token}", "Bearer "):
        client = bearer_client("x")
        client.credentials(**({"HTTP_AUTHORIZATION": header} if header else {}))
        resp = client.get("/internal/v1/credentials/mail")
        assert_problem(resp, 401)
        assert VALUE.encode() not in resp.content
        assert_problem(client.post("/internal/v1/heartbeat", data={}, format="json"), 401)


def test_staff_session_does_not_authenticate_internal_endpoints(tenant, client, django_user_model):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw-long-enough-123")
    client.force_login(staff)
    assert_problem(client.get("/internal/v1/credentials/mail"), 401)


def test_instance_of_a_deleted_tenant_is_refused(tenant, instance_client):
    credential_put(tenant=tenant, name="mail", value=VALUE, actor=SYSTEM)
    tenant.status = "deleted"
    tenant.save()
    assert_problem(instance_client.get("/internal/v1/credentials/mail"), 401)


def test_heartbeat_records_progress_without_csrf(tenant):
    from rest_framework.test import APIClient

    token = make_instance(tenant)
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"task": "t-1", "step": "fetch", "checkpoint": "c-3", "progress_seq": 7, "status": "running"}
    assert client.post("/internal/v1/heartbeat", data=body, format="json").status_code == 204
    from provisioning.recovery.heartbeats import heartbeat_store, heartbeats_sync

    instance = AgentInstance.objects.get(tenant=tenant)
    beat = heartbeat_store().get(str(instance.pk))  # Redis when configured, else PostgreSQL
    assert beat is not None and beat.progress_seq == 7 and beat.progress["step"] == "fetch"
    heartbeats_sync()  # PostgreSQL stays the record
    instance.refresh_from_db()
    assert instance.last_heartbeat_at is not None and {k: instance.progress.get(k) for k in body} == body
    assert_problem(client.post("/internal/v1/heartbeat", data={"progress_seq": "many"}, format="json"), 400)
    assert_problem(client.post("/internal/v1/heartbeat", data=[1], format="json"), 400)


def test_object_keys_endpoint_gives_current_then_previous(tenant, instance_client):
    import base64

    from vault.rotation import data_key_rotate_start, rotation_job_execute
    from vault.services import tenant_object_key

    before = tenant_object_key(tenant=tenant)
    first = instance_client.get("/internal/v1/object-keys").json()
    assert [k["version"] for k in first["keys"]] == [1]
    assert base64.b64decode(first["current"]["key_b64"]) == before
    job = data_key_rotate_start(tenant=tenant, purpose="objects", actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    after = instance_client.get("/internal/v1/object-keys").json()
    assert [(k["version"], k["status"]) for k in after["keys"]] == [(2, "active"), (1, "retired")]
    assert base64.b64decode(after["keys"][1]["key_b64"]) == before != tenant_object_key(tenant=tenant)
    assert AuditLog.objects.filter(action="vault.object_keys.deliver", tenant=tenant).count() == 2
