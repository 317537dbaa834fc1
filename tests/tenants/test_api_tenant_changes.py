"""The tenant API as a business uses it: PATCH, plans as records and their daily quotas, filters and cursor
pages, strict query strings and bodies, and the lifecycle actions' refusals (the worker side is in
test_recovery.py::test_suspend_resume_and_restart_through_the_api)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import InboxItem
from tenants.models import AuditLog, Plan, Tenant
from tests.tenants.test_api_tenants import assert_problem, post

pytestmark = pytest.mark.django_db


def patch(api, tenant_id: str, body: object):  # type: ignore[no-untyped-def]
    return api.patch(f"/api/v1/tenants/{tenant_id}", data=json.dumps(body), content_type="application/json")


def action(api, tenant_id: str, name: str, body: object | None = None):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/tenants/{tenant_id}/{name}", data=json.dumps(body if body is not None else {}),
                    content_type="application/json")


def test_patch_changes_name_plan_and_merges_metadata(api):
    tenant = post(api, {"slug": "acme", "name": "Acme", "metadata": {"crm": "42", "region": "eu"}}).json()
    assert tenant["plan"] == "standard" and tenant["metadata"] == {"crm": "42", "region": "eu"}
    resp = patch(api, tenant["id"], {"name": "Acme Ltd", "plan": "large", "metadata": {"region": "", "tier": "gold"}})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["name"], body["plan"], body["metadata"]) == ("Acme Ltd", "large", {"crm": "42", "tier": "gold"})
    stored = Tenant.objects.get(pk=tenant["id"])
    assert stored.plan_id == "large" and stored.metadata == {"crm": "42", "tier": "gold"}
    audit = AuditLog.objects.get(action="tenant.update", target_id=tenant["id"])
    assert audit.data["plan"] == {"from": "standard", "to": "large"} and audit.data["name"]["to"] == "Acme Ltd"
    assert sorted(audit.data["metadata"]) == ["region", "tier"]  # key names only, never values
    # The same PATCH again changes nothing and writes no second audit row.
    patch(api, tenant["id"], {"name": "Acme Ltd", "plan": "large"})
    assert AuditLog.objects.filter(action="tenant.update", target_id=tenant["id"]).count() == 1


@pytest.mark.parametrize("body, needle", [
    ({"is_admin": True}, "unknown fields: is_admin"),
    ({"plan": "platinum"}, "plan 'platinum' is not offered"),
    ({"name": ""}, "name"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"metadata": {"x" * 41: "v"}}, "metadata keys"),
    ({"metadata": {"a\u0000b": "v"}}, "metadata keys"),  # PostgreSQL's jsonb cannot hold it: was a 500
    ({"metadata": {"a": "v\u0000"}}, "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(51)}}, "at most 50"),
    ([], "JSON object"),
])
def test_patch_refuses_bad_input_and_changes_nothing(api, body, needle):
    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()
    problem = assert_problem(patch(api, tenant["id"], body), 400)
    assert needle in json.dumps(problem), problem
    stored = Tenant.objects.get(pk=tenant["id"])
    assert (stored.name, stored.plan_id, stored.metadata) == ("Acme", "standard", {})


def test_plans_are_records_onboarding_refuses_the_rest(api):
    listed = api.get("/api/v1/plans").json()
    assert {p["slug"] for p in listed} == {"standard", "large"}
    assert_problem(post(api, {"slug": "x1", "name": "X", "plan": "free text"}), 400)
    Plan.objects.create(slug="retired", name="Retired", is_active=False)
    problem = assert_problem(post(api, {"slug": "x2", "name": "X", "plan": "retired"}), 400)
    assert "available: large, standard" in problem["detail"]
    assert not Tenant.objects.filter(slug__in=["x1", "x2"]).exists()  # nothing half-registered
    assert "retired" not in {p["slug"] for p in api.get("/api/v1/plans").json()}


def test_a_plan_without_kubernetes_resources_is_refused_in_that_profile(api, settings):
    Plan.objects.create(slug="tiny", name="Tiny")
    settings.PROVISIONING_PROFILE = "kubernetes"
    problem = assert_problem(post(api, {"slug": "k1", "name": "K", "plan": "tiny"}), 400)
    assert "KUBERNETES_PLANS" in problem["detail"]


def test_daily_message_quota_of_the_plan(api):
    Plan.objects.create(slug="trial", name="Trial", max_messages_per_day=2)
    tenant = post(api, {"slug": "trial-co", "name": "Trial", "plan": "trial"}).json()
    url = f"/api/v1/tenants/{tenant['id']}/threads/main/messages"

    def send(key: str):  # type: ignore[no-untyped-def]
        return api.post(url, data=json.dumps({"content": f"hello {key}"}), content_type="application/json",
                        HTTP_IDEMPOTENCY_KEY=key)

    assert send("a").status_code == 202 and send("b").status_code == 202  # queued: the instance is not up
    problem = assert_problem(send("c"), 429)
    assert problem["limit"] == 2 and problem["plan"] == "trial"
    assert send("a").status_code == 202  # a retry of an accepted message is answered, not refused
    assert InboxItem.objects.filter(tenant_id=tenant["id"], kind="message").count() == 2
    # Yesterday's messages do not count.
    InboxItem.objects.filter(tenant_id=tenant["id"]).update(created_at=timezone.now() - timedelta(days=1))
    assert send("d").status_code == 202


def test_filters_search_and_cursor_pages(api):
    for slug, name in (("alpha", "Alpha Inc"), ("beta", "Beta Ltd"), ("gamma", "Gamma Alpha")):
        post(api, {"slug": slug, "name": name})
    Tenant.objects.filter(slug="beta").update(status="ready")
    Tenant.objects.filter(slug="gamma").update(status="suspended",
                                                created_at=timezone.now() - timedelta(days=3))

    def slugs(query: str) -> list[str]:
        resp = api.get(f"/api/v1/tenants?{query}")
        assert resp.status_code == 200, resp.content
        return sorted(t["slug"] for t in resp.json()["results"])

    assert slugs("slug=beta") == ["beta"]
    assert slugs("search=alpha") == ["alpha", "gamma"]  # slug or name, case-insensitive
    assert slugs("status=ready&status=suspended") == ["beta", "gamma"]
    since = (timezone.now() - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert slugs(f"created_after={since}") == ["alpha", "beta"]
    assert slugs(f"created_before={since}") == ["gamma"]
    assert slugs("plan=large") == []
    seen, url = [], "/api/v1/tenants?limit=1"
    while url:
        page = api.get(url).json()
        seen += [t["slug"] for t in page["results"]]
        url = page["next"]
    assert seen == ["beta", "alpha", "gamma"] or sorted(seen) == ["alpha", "beta", "gamma"]
    assert len(seen) == 3


@pytest.mark.parametrize("query, needle", [
    ("stauts=ready", "unknown query parameters: stauts"),
    ("offset=10", "unknown query parameters: offset"),
    ("limit=abc", "limit must be a whole number"),
    ("limit=0", "limit must be a whole number"),
    ("status=bogus", "status"),
    ("created_after=yesterday", "created_after"),
    ("created_before=", "an empty value is not an ISO 8601 date-time"),  # present means a date-time
    ("limit=501", "limit must be a whole number from 1 to 500"),
    ("cursor=not-a-cursor", "cursor is not one this API gave out"),
])
def test_list_refuses_unknown_and_malformed_parameters(api, query, needle):
    problem = assert_problem(api.get(f"/api/v1/tenants?{query}"), 404 if query.startswith("cursor") else 400)
    assert needle in json.dumps(problem), problem


def test_request_bodies_are_closed_in_the_schema(client):
    schema = client.get("/api/schema/?format=json").json()["components"]["schemas"]
    for name in ("TenantCreateInputRequest", "PatchedTenantUpdateInputRequest", "MessageInputRequest"):
        assert schema[name]["additionalProperties"] is False, name
    plan = schema["TenantCreateInputRequest"]["properties"]["plan"]
    ref = (plan.get("allOf") or [plan])[0].get("$ref", "")
    assert (schema[ref.rsplit("/", 1)[-1]] if ref else plan)["enum"] == ["large", "standard"]  # offered plans


def test_the_schema_says_what_the_server_refuses_in_strings(client, settings):
    """NUL is refused in every parameter and body string (a 400), and a webhook URL's form is a pattern: a
    generated client or fuzzer that follows the schema never sends what the server refuses for its form."""
    import re

    settings.WEBHOOK_ALLOW_HTTP = False
    doc = client.get("/api/schema/?format=json").json()
    nul_free = "^[^\\x00]*$"
    tenants_list = doc["paths"]["/api/v1/tenants"]["get"]["parameters"]
    assert {p["name"]: p["schema"].get("pattern") for p in tenants_list}["search"] == nul_free
    events = {p["name"]: p["schema"] for p in doc["paths"]["/api/v1/events"]["get"]["parameters"]}
    assert events["cursor"]["pattern"] == nul_free
    schemas = doc["components"]["schemas"]
    assert schemas["MessageInputRequest"]["properties"]["content"]["pattern"] == nul_free
    metadata = schemas["TenantCreateInputRequest"]["properties"]["metadata"]
    assert metadata["additionalProperties"]["pattern"] == nul_free and "\\x00" in metadata["propertyNames"]["pattern"]
    url = re.compile(schemas["EndpointCreateInputRequest"]["properties"]["url"]["pattern"])
    assert url.match("https://hooks.example.com/in?x=1") and url.match("https://h.example:8443/")
    for refused in ("0", "http://h.example/", "https://u:p@h.example/", "https://h.example:99999/", "https:///x"):
        assert not url.match(refused), refused


def test_other_endpoints_refuse_unknown_parameters_too(api):
    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()
    for path in (f"/api/v1/tenants/{tenant['id']}?expand=all", f"/api/v1/tenants/{tenant['id']}/recoveries?x=1",
                 f"/api/v1/tenants/{tenant['id']}/credentials?limit=abc", "/api/v1/plans?all=1",
                 f"/api/v1/tenants/{tenant['id']}/threads/main/messages?afterr=1"):
        assert_problem(api.get(path), 400)


def test_lifecycle_actions_refuse_what_the_status_does_not_allow(api):
    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()  # pending: no worker in this test
    assert "cannot be restarted" in assert_problem(action(api, tenant["id"], "restart"), 409)["detail"]
    assert "cannot be suspended" in assert_problem(action(api, tenant["id"], "suspend"), 409)["detail"]
    assert "only a suspended" in assert_problem(action(api, tenant["id"], "resume"), 409)["detail"]
    assert "unknown fields: force" in assert_problem(action(api, tenant["id"], "restart", {"force": True}),
                                                     400)["detail"]
    Tenant.objects.filter(pk=tenant["id"]).update(status="ready")
    resp = action(api, tenant["id"], "suspend", {"reason": "unpaid invoice"})
    assert resp.status_code == 202 and resp.json()["status"] == "suspended"
    assert resp.json()["status_reason"] == "unpaid invoice"
    assert action(api, tenant["id"], "suspend").status_code == 202  # again: nothing changes
    assert_problem(action(api, tenant["id"], "restart"), 409)
    assert action(api, tenant["id"], "resume").json()["status"] == "ready"


def test_read_only_tokens_cannot_act(api, make_token):
    from rest_framework.test import APIClient

    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(api.operator, scopes=['tenants:read'])}")
    for name in ("suspend", "resume", "restart"):
        assert_problem(action(reader, tenant["id"], name), 403)
    assert_problem(patch(reader, tenant["id"], {"name": "Nope"}), 403)
    assert Tenant.objects.get(pk=tenant["id"]).name == "Acme"


def test_responses_carry_no_host_path_or_loopback_endpoint(api):
    from django.conf import settings

    from provisioning.models import AgentInstance, ProvisionedResource

    tenant = post(api, {"slug": "acme", "name": "Acme"}).json()
    volume = f"{settings.LOCAL_VOLUME_ROOT}/t_{tenant['id'].replace('-', '')}"
    ProvisionedResource.objects.create(tenant_id=tenant["id"], kind="volume", driver="local",
                                       external_id=volume, status="ready")
    ProvisionedResource.objects.create(tenant_id=tenant["id"], kind="objectstore", driver="local",
                                       external_id=f"var/objectstore/tenants/{tenant['id']}/", status="ready")
    AgentInstance.objects.filter(tenant_id=tenant["id"]).update(endpoint="http://127.0.0.1:41234")
    text = api.get(f"/api/v1/tenants/{tenant['id']}").content.decode()
    assert str(settings.LOCAL_VOLUME_ROOT) not in text and "127.0.0.1" not in text and "var/" not in text
    assert f'"tenants/{tenant["id"]}/"' in text  # the object prefix, as S3 names it
    assert f"t_{tenant['id'].replace('-', '')}" in text  # the resource is still named
