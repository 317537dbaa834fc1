"""Credential API under a tenant: write-only values, scopes, reserved names, operator scoping, schema."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from tenants.models import AuditLog
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.models import Credential
from vault.services import credential_reveal

pytestmark = pytest.mark.django_db

SECRET = "pw-3c1f0e4b9a77-unique"


def put(client: APIClient, tenant_id: object, name: str, body: object):  # type: ignore[no-untyped-def]
    return client.put(f"/api/v1/tenants/{tenant_id}/credentials/{name}", data=json.dumps(body),
                      content_type="application/json")


@pytest.fixture
def tenant(api):  # type: ignore[no-untyped-def]
    return make_tenant(api.operator)


def test_put_creates_then_versions_and_never_returns_the_value(api, tenant):
    first = put(api, tenant.pk, "llm-key", {"value": SECRET})
    assert first.status_code == 201, first.content
    assert first.json()["name"] == "llm-key" and first.json()["version"] == 1
    assert first.json()["state"] == "active" and first.json()["one_time"] is False
    again = put(api, tenant.pk, "llm-key", {"value": SECRET + "-2", "one_time": True})
    assert again.status_code == 200 and again.json()["version"] == 2 and again.json()["one_time"] is True
    for resp in (first, again):
        assert SECRET.encode() not in resp.content and "value" not in resp.json()
    from tenants.actors import SYSTEM

    assert credential_reveal(tenant=tenant, name="llm-key", actor=SYSTEM, audit=False) == SECRET + "-2"
    audit = AuditLog.objects.filter(action="credential.put", tenant=tenant).order_by("id")
    assert [a.data["version"] for a in audit] == [1, 2]
    assert all(a.actor_kind == "token" for a in audit)
    assert all(SECRET not in json.dumps(a.data) for a in audit)


def test_whitespace_in_values_is_kept(api, tenant):
    from tenants.actors import SYSTEM

    assert put(api, tenant.pk, "pem", {"value": "  line1\nline2\n"}).status_code == 201
    assert credential_reveal(tenant=tenant, name="pem", actor=SYSTEM, audit=False) == "  line1\nline2\n"


def test_list_shows_metadata_and_last_use_never_values_or_system_names(api, tenant):
    token = make_instance(tenant)  # creates system.instance-token
    put(api, tenant.pk, "b-key", {"value": SECRET})
    put(api, tenant.pk, "a-key", {"value": SECRET + "x"})
    bearer_client(token).get("/internal/v1/credentials/a-key")
    resp = api.get(f"/api/v1/tenants/{tenant.pk}/credentials")
    assert resp.status_code == 200
    body = resp.json()
    assert body["count"] == 2
    assert [c["name"] for c in body["results"]] == ["a-key", "b-key"]
    a_key, b_key = body["results"]
    assert a_key["last_used_at"] is not None and b_key["last_used_at"] is None
    assert set(a_key) == {"name", "version", "one_time", "state", "created_at", "updated_at", "last_used_at",
                          "revoked_at", "consumed_at"}
    assert SECRET.encode() not in resp.content and b"system." not in resp.content
    detail = api.get(f"/api/v1/tenants/{tenant.pk}/credentials/a-key")
    assert detail.status_code == 200 and detail.json()["name"] == "a-key"


def test_delete_revokes(api, tenant):
    put(api, tenant.pk, "llm-key", {"value": SECRET})
    resp = api.delete(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key")
    assert resp.status_code == 204 and resp.content == b""
    assert Credential.objects.get(tenant=tenant, name="llm-key").revoked_at is not None
    assert api.get(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key").json()["state"] == "revoked"
    assert_problem(api.delete(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key"), 404)
    assert_problem(api.delete(f"/api/v1/tenants/{tenant.pk}/credentials/never-was"), 404)
    assert AuditLog.objects.filter(action="credential.revoke", tenant=tenant).count() == 1
    # A new PUT brings it back as a new version.
    assert put(api, tenant.pk, "llm-key", {"value": SECRET}).json()["state"] == "active"


def test_system_names_are_reserved(api, tenant):
    make_instance(tenant)
    body = assert_problem(put(api, tenant.pk, "system.instance-token", {"value": SECRET}), 400)
    assert "reserved" in body["detail"] and SECRET not in json.dumps(body)
    assert_problem(put(api, tenant.pk, "system.new", {"value": SECRET}), 400)
    assert_problem(api.delete(f"/api/v1/tenants/{tenant.pk}/credentials/system.instance-token"), 404)
    assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/credentials/system.instance-token"), 404)
    assert Credential.objects.get(tenant=tenant, name="system.instance-token").revoked_at is None


def test_writes_need_the_credentials_write_scope(operator, make_token, tenant):
    client = bearer_client(make_token(operator, scopes=["tenants:read", "tenants:write"]))
    assert_problem(put(client, tenant.pk, "llm-key", {"value": SECRET}), 403)
    assert not Credential.objects.exists()
    writer = bearer_client(make_token(operator, scopes=["credentials:write"]))
    assert put(writer, tenant.pk, "llm-key", {"value": SECRET}).status_code == 201
    assert_problem(client.delete(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key"), 403)
    assert client.get(f"/api/v1/tenants/{tenant.pk}/credentials").status_code == 200
    assert Credential.objects.get().revoked_at is None


def test_another_operators_tenant_is_not_found(api, make_token, tenant):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    put(api, tenant.pk, "llm-key", {"value": SECRET})
    other = bearer_client(make_token(operator_create(slug="other-op", name="Other", actor=SYSTEM)))
    assert_problem(other.get(f"/api/v1/tenants/{tenant.pk}/credentials"), 404)
    assert_problem(other.get(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key"), 404)
    assert_problem(put(other, tenant.pk, "llm-key", {"value": "overwrite"}), 404)
    assert_problem(other.delete(f"/api/v1/tenants/{tenant.pk}/credentials/llm-key"), 404)
    assert_problem(other.get("/api/v1/tenants/not-a-uuid/credentials"), 404)
    assert Credential.objects.get().current_version == 1 and Credential.objects.get().revoked_at is None


@pytest.mark.parametrize(
    "body",
    [{}, {"value": ""}, {"value": 12345}, {"value": True}, {"value": None}, {"value": ["x"]},
     {"value": SECRET, "one_time": "sometimes"}, [SECRET], SECRET, {"value": "x" * 70000}],
)
def test_bad_bodies_are_400_and_never_echo_the_value(api, tenant, body):
    resp = put(api, tenant.pk, "llm-key", body)
    assert_problem(resp, 400)
    assert SECRET.encode() not in resp.content and b"xxxxxxxxxx" not in resp.content
    assert not Credential.objects.exists()


@pytest.mark.parametrize("name", ["has space", "slash%2Fname", "ünï", "a" * 101, "semi;colon"])
def test_bad_names_are_refused(api, tenant, name):
    assert put(api, tenant.pk, name, {"value": SECRET}).status_code in (400, 404)
    assert not Credential.objects.exists()


def test_closed_tenant_refuses_new_values(api, tenant):
    tenant.status = "deprovisioning"
    tenant.save()
    assert_problem(put(api, tenant.pk, "llm-key", {"value": SECRET}), 409)


def test_instance_token_is_refused_on_the_operator_api(api, tenant):
    token = make_instance(tenant)
    client = bearer_client(token)
    assert_problem(client.get(f"/api/v1/tenants/{tenant.pk}/credentials"), 401)
    assert_problem(put(client, tenant.pk, "llm-key", {"value": SECRET}), 401)
    assert_problem(client.get("/api/v1/tenants"), 401)
    assert not Credential.objects.filter(name="llm-key").exists()


def test_schema_documents_the_credentials_api_without_values_in_responses(client):
    doc = json.loads(client.get("/api/schema/?format=json").content)
    paths = doc["paths"]
    assert set(paths["/api/v1/tenants/{tenant_id}/credentials"]) >= {"get"}
    assert set(paths["/api/v1/tenants/{tenant_id}/credentials/{name}"]) >= {"get", "put", "delete"}
    assert not any(p.startswith("/internal/") for p in paths)
    schemas = doc["components"]["schemas"]
    assert "value" in schemas["CredentialPutInputRequest"]["properties"]
    assert "value" not in schemas["CredentialOutput"]["properties"]
