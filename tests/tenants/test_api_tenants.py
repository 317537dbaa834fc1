"""The onboarding REST API: status codes, problem+json, idempotency, scoping between operators."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from controlplane.problem_types import has_page
from provisioning.models import WorkflowRun
from releases.models import AgentRelease, DefaultRelease
from tenants.models import AuditLog, Tenant

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def post(client: APIClient, body: object, **headers: str):  # type: ignore[no-untyped-def]
    """Onboard: these operators have no default release, so the body says on purpose that none is meant (a body
    that names the flag itself, or is not an object, goes as it is)."""
    if isinstance(body, dict) and "allow_no_release" not in body:
        body = {**body, "allow_no_release": True}
    return client.post("/api/v1/tenants", data=json.dumps(body), content_type="application/json", **headers)


def assert_problem(resp, status: int) -> dict:  # type: ignore[no-untyped-def]
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"].startswith(PROBLEM)
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"] and has_page(body["type"])
    return body


def test_smallest_valid_body_is_accepted_with_status_url(api):
    resp = post(api, {"slug": "acme-corp", "name": "Acme Corp"})
    assert resp.status_code == 202, resp.content
    body = resp.json()
    assert body["slug"] == "acme-corp" and body["status"] == "pending" and body["resources"] == []
    assert resp["Location"].endswith(f"/api/v1/tenants/{body['id']}")
    assert WorkflowRun.objects.filter(tenant_id=body["id"], kind="onboard").count() == 1
    assert AuditLog.objects.filter(action="tenant.onboard", target_id=body["id"]).exists()


def test_onboarding_without_a_default_release_is_refused_unless_meant(api):
    """Issue 32: a customer onboarded before the operator has a default release would run no release of its own."""
    def raw_post(body: dict):  # type: ignore[no-untyped-def,type-arg]
        return api.post("/api/v1/tenants", data=json.dumps(body), content_type="application/json")

    problem = assert_problem(raw_post({"slug": "no-release", "name": "No Release"}), 409)
    assert problem["type"] == "/problems/no-default-release" and "allow_no_release" in problem["detail"]
    assert not Tenant.objects.filter(operator=api.operator).exists()
    assert not WorkflowRun.objects.filter(tenant__operator=api.operator).exists()
    assert_problem(raw_post({"slug": "no-release", "name": "No Release", "allow_no_release": "yes"}), 400)
    meant = raw_post({"slug": "no-release", "name": "No Release", "allow_no_release": True})
    assert meant.status_code == 202, meant.content
    assert AuditLog.objects.get(action="tenant.onboard", target_id=meant.json()["id"]).data["release"] is None
    release = AgentRelease.objects.create(operator=api.operator, version="1.4.0", distribution="greeter-agent",
                                          digest="sha256:" + "ab" * 32, filename="g.whl", size_bytes=1,
                                          artifact_key="x", kinds={"greeter": "says hello"})
    DefaultRelease.objects.create(operator=api.operator, release=release)
    started = raw_post({"slug": "on-release", "name": "On Release"})  # the default exists: no flag needed
    assert started.status_code == 202, started.content
    assert AuditLog.objects.get(action="tenant.onboard", target_id=started.json()["id"]).data["release"] == "1.4.0"


def test_same_idempotency_key_returns_the_same_tenant(api):
    first = post(api, {"slug": "acme", "name": "Acme"}, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(api, {"slug": "acme", "name": "Acme"}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert Tenant.objects.filter(operator=api.operator).count() == 1
    assert WorkflowRun.objects.filter(tenant__operator=api.operator).count() == 1


def test_same_key_with_a_different_body_is_refused(api):
    post(api, {"slug": "acme", "name": "Acme"}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert_problem(post(api, {"slug": "other", "name": "Other"}, HTTP_IDEMPOTENCY_KEY="k-1"), 422)


def test_different_key_same_slug_conflicts(api):
    post(api, {"slug": "acme", "name": "Acme"}, HTTP_IDEMPOTENCY_KEY="k-1")
    body = assert_problem(post(api, {"slug": "acme", "name": "Acme"}, HTTP_IDEMPOTENCY_KEY="k-2"), 409)
    assert "acme" in body["detail"]
    assert Tenant.objects.filter(operator=api.operator).count() == 1


@pytest.mark.parametrize(
    "slug",
    ['x"; drop schema public; --', "Robert'); DROP TABLE tenants_tenant;--", "public", "pg_catalog",
     "information_schema", "pg-toast", "ünïcödé", "a" * 200, "", "-lead", "trail-", "UPPER", "has space",
     "t_" + "0" * 32, None, ["list"], {"a": 1}],
)
def test_hostile_or_reserved_slugs_are_refused(api, slug):
    resp = post(api, {"slug": slug, "name": "X"})
    assert_problem(resp, 400)
    assert not Tenant.objects.exists()


def test_a_name_that_looks_like_sql_is_stored_verbatim(api):
    name = 'Acme"; DROP SCHEMA public CASCADE; --'
    resp = post(api, {"slug": "acme", "name": name})
    assert resp.status_code == 202
    assert Tenant.objects.get().name == name


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"a string"', b"", b"null"])
def test_malformed_json_is_a_400_problem(api, raw):
    resp = api.post("/api/v1/tenants", data=raw, content_type="application/json")
    assert_problem(resp, 400)


def test_oversized_body_is_refused(api, settings):
    body = json.dumps({"slug": "big", "name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)})
    resp = api.post("/api/v1/tenants", data=body, content_type="application/json")
    assert_problem(resp, 413)
    assert resp.json()["max_bytes"] == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert not Tenant.objects.exists()


def test_missing_invalid_and_revoked_tokens_are_401(operator, make_token):
    from tenants.actors import SYSTEM
    from tenants.tokens import operator_token_revoke

    client = APIClient()
    assert_problem(client.get("/api/v1/tenants"), 401)
    client.credentials(HTTP_AUTHORIZATION="Bearer cpk_nothere_nothing")
    assert_problem(client.get("/api/v1/tenants"), 401)
    token = make_token(operator)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/tenants").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token[:-2]}xx")
    assert_problem(client.get("/api/v1/tenants"), 401)
    operator_token_revoke(operator=operator, prefix=token.split("_")[1], actor=SYSTEM)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert_problem(client.get("/api/v1/tenants"), 401)


def test_read_only_token_cannot_onboard(operator, make_token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator, scopes=['tenants:read'])}")
    assert client.get("/api/v1/tenants").status_code == 200
    assert_problem(post(client, {"slug": "acme", "name": "Acme"}), 403)


def test_another_operators_tenant_is_404_for_read_and_delete(api, make_token):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    mine = post(api, {"slug": "acme", "name": "Acme"}).json()
    other_op = operator_create(slug="other-op", name="Other", actor=SYSTEM)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(other_op)}")
    assert_problem(other.get(f"/api/v1/tenants/{mine['id']}"), 404)
    assert_problem(other.delete(f"/api/v1/tenants/{mine['id']}"), 404)
    assert other.get("/api/v1/tenants").json()["results"] == []
    assert_problem(other.get("/api/v1/tenants/not-a-uuid"), 404)
    assert Tenant.objects.get(pk=mine["id"]).status == "pending"


def test_list_paginates_and_filters_by_status(api):
    for i in range(3):
        post(api, {"slug": f"c-{i}", "name": f"C {i}"})
    Tenant.objects.filter(slug="c-0").update(status="ready")
    page = api.get("/api/v1/tenants?limit=2").json()
    assert len(page["results"]) == 2 and page["next"] and "cursor=" in page["next"]
    rest = api.get(page["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None
    assert {t["slug"] for t in page["results"] + rest["results"]} == {"c-0", "c-1", "c-2"}
    ready = api.get("/api/v1/tenants?status=ready").json()
    assert [t["slug"] for t in ready["results"]] == ["c-0"]
    assert_problem(api.get("/api/v1/tenants?status=bogus"), 400)


def test_delete_starts_deprovisioning_once_and_the_tenant_is_then_gone(api):
    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()
    first = api.delete(f"/api/v1/tenants/{tenant['id']}")
    assert first.status_code == 202 and first.json()["status"] == "deprovisioning"
    # As after any DELETE: the detail routes answer 404; the list still shows it under its status.
    assert_problem(api.delete(f"/api/v1/tenants/{tenant['id']}"), 404)
    assert_problem(api.get(f"/api/v1/tenants/{tenant['id']}"), 404)
    assert_problem(api.patch(f"/api/v1/tenants/{tenant['id']}", {"name": "x"}, format="json"), 404)
    listed = api.get("/api/v1/tenants?status=deprovisioning").json()["results"]
    assert [t["id"] for t in listed] == [tenant["id"]]
    assert WorkflowRun.objects.filter(tenant_id=tenant["id"], kind="deprovision").count() == 1


def test_quota_is_enforced(api):
    api.operator.tenant_quota = 1
    api.operator.save()
    assert post(api, {"slug": "one", "name": "One"}).status_code == 202
    assert_problem(post(api, {"slug": "two", "name": "Two"}), 429)


def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    doc = json.loads(schema.content)
    assert doc["openapi"].startswith("3.")
    assert "/api/v1/tenants" in doc["paths"] and "/api/v1/tenants/{tenant_id}" in doc["paths"]
    assert client.get("/api/docs/").status_code == 200
