"""Issue 34, the control plane's side: the registry of MCP servers (per operator, per customer), delivered to an
instance inside its configuration (only its own tenant's), and checked with the runtime's own rules."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from connections.models import OAuthClient
from mcp_servers.models import McpServer
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.vault.test_vault_helpers import assert_problem, make_instance, make_tenant
from vault.services import credential_put

pytestmark = pytest.mark.django_db
SECRET = "crm-bearer-9c1d-never-shown"


@pytest.fixture(autouse=True)
def _https_only(settings):  # type: ignore[no-untyped-def]
    settings.MCP_SERVERS_ALLOW_HTTP = False


def _instance(tenant: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_instance(tenant)}")
    return client


def test_operator_and_customer_servers_reach_only_that_customers_instance(api, operator, make_token) -> None:  # type: ignore[no-untyped-def]
    tenant_a, tenant_a2 = make_tenant(operator), make_tenant(operator)
    credential_put(tenant=tenant_a, name="crm-token", value=SECRET, actor=SYSTEM)
    shared = api.post("/api/v1/mcp-servers", {"name": "docs", "url": "https://docs.example/mcp",
                                              "tools": {"search": {"kind": "read_only", "ttl_s": 60}},
                                              "allowed_tools": ["search"]}, format="json")
    assert shared.status_code == 201, shared.content
    own = api.post(f"/api/v1/tenants/{tenant_a.pk}/mcp-servers",
                   {"name": "crm", "url": "https://crm.example/mcp", "credential": "crm-token",
                    "trust_annotations": False, "tools": {"send_money": "effect"}}, format="json")
    assert own.status_code == 201, own.content
    assert own.json()["scope"] == "tenant" and shared.json()["scope"] == "operator"
    # A's instance gets both (the runtime's `mcp` shape); A2's only the operator's; names, never the value.
    delivered = _instance(tenant_a).get("/internal/v1/agent-config")
    assert delivered.status_code == 200
    mcp = delivered.json()["config"]["mcp"]
    assert mcp == {
        "crm": {"url": "https://crm.example/mcp", "credential": "crm-token", "trust_annotations": False,
                "timeout_s": 30.0, "tools": {"send_money": "effect"}},
        "docs": {"url": "https://docs.example/mcp", "trust_annotations": True, "timeout_s": 30.0,
                 "tools": {"search": {"kind": "read_only", "ttl_s": 60}}, "allowed_tools": ["search"]},
    }
    assert SECRET not in delivered.content.decode() and SECRET not in own.content.decode()
    assert set(_instance(tenant_a2).get("/internal/v1/agent-config").json()["config"]["mcp"]) == {"docs"}
    # Another operator's customer's instance sees none of them.
    operator_b = operator_create(slug="mcp-b", name="B", actor=SYSTEM)
    assert "mcp" not in _instance(make_tenant(operator_b)).get("/internal/v1/agent-config").json()["config"]
    # The customer's list: both, one per name; audited.
    listed = api.get(f"/api/v1/tenants/{tenant_a.pk}/mcp-servers").json()
    assert [(s["name"], s["scope"]) for s in listed] == [("crm", "tenant"), ("docs", "operator")]
    assert AuditLog.objects.filter(action="mcp_server.create").count() == 2


def test_a_customers_server_of_the_same_name_replaces_the_operators(api, operator) -> None:  # type: ignore[no-untyped-def]
    tenant = make_tenant(operator)
    assert api.post("/api/v1/mcp-servers", {"name": "crm", "url": "https://shared.example/mcp"},
                    format="json").status_code == 201
    mine = api.post(f"/api/v1/tenants/{tenant.pk}/mcp-servers", {"name": "crm", "url": "https://own.example/mcp"},
                    format="json")
    assert mine.status_code == 201
    assert _instance(tenant).get("/internal/v1/agent-config").json()["config"]["mcp"]["crm"]["url"] == \
        "https://own.example/mcp"
    assert api.delete(f"/api/v1/tenants/{tenant.pk}/mcp-servers/{mine.json()['id']}").status_code == 204
    assert _instance(tenant).get("/internal/v1/agent-config").json()["config"]["mcp"]["crm"]["url"] == \
        "https://shared.example/mcp"


def test_refusals_are_problems_naming_the_field(api, operator) -> None:  # type: ignore[no-untyped-def]
    tenant = make_tenant(operator)
    base = f"/api/v1/tenants/{tenant.pk}/mcp-servers"
    # The URL's form is the body's schema (controlplane.urlform): refused by the serializer, the field in `errors`.
    plain_http = assert_problem(api.post(base, {"name": "crm", "url": "http://crm.example/mcp"}, format="json"), 400)
    assert [error["field"] for error in plain_http["errors"]] == ["url"]
    assert assert_problem(api.post(base, {"name": "crm", "url": "https://crm.example/mcp", "credential": "absent"},
                                   format="json"), 400)["field"] == "credential"
    assert assert_problem(api.post(base, {"name": "crm", "url": "https://crm.example/mcp", "connection": "acme"},
                                   format="json"), 400)["field"] == "connection"
    # The runtime's own rules: a TTL only for a read-only tool.
    refused = assert_problem(api.post(base, {"name": "crm", "url": "https://crm.example/mcp",
                                             "tools": {"pay": {"kind": "effect", "ttl_s": 5}}}, format="json"), 400)
    assert "ttl_s" in refused["field"]
    assert assert_problem(api.post(base, {"name": "crm", "url": "https://crm.example/mcp", "token": SECRET},
                                   format="json"), 400)
    assert api.post(base, {"name": "crm", "url": "https://crm.example/mcp"}, format="json").status_code == 201
    assert_problem(api.post(base, {"name": "crm", "url": "https://crm.example/mcp"}, format="json"), 409)
    assert McpServer.objects.count() == 1


def test_a_connected_accounts_provider_is_named_not_its_token(api, operator) -> None:  # type: ignore[no-untyped-def]
    tenant = make_tenant(operator)
    OAuthClient.objects.create(operator=operator, provider="acme", client_id="c",
                               authorization_endpoint="https://idp.example/authorize",
                               token_endpoint="https://idp.example/token")
    made = api.post(f"/api/v1/tenants/{tenant.pk}/mcp-servers",
                    {"name": "acme", "url": "https://acme.example/mcp", "connection": "acme"}, format="json")
    assert made.status_code == 201, made.content
    spec = _instance(tenant).get("/internal/v1/agent-config").json()["config"]["mcp"]["acme"]
    assert spec["connection"] == "acme" and "credential" not in spec


def test_another_operator_cannot_see_or_remove_a_server(api, operator, make_token) -> None:  # type: ignore[no-untyped-def]
    tenant = make_tenant(operator)
    made = api.post(f"/api/v1/tenants/{tenant.pk}/mcp-servers", {"name": "crm", "url": "https://crm.example/mcp"},
                    format="json").json()
    shared = api.post("/api/v1/mcp-servers", {"name": "docs", "url": "https://docs.example/mcp"},
                      format="json").json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator_create(slug='mcp-o', name='O', actor=SYSTEM))}")
    assert_problem(other.get(f"/api/v1/tenants/{tenant.pk}/mcp-servers"), 404)
    assert_problem(other.delete(f"/api/v1/tenants/{tenant.pk}/mcp-servers/{made['id']}"), 404)
    assert_problem(other.delete(f"/api/v1/mcp-servers/{shared['id']}"), 404)
    assert other.get("/api/v1/mcp-servers").json() == []
    assert McpServer.objects.count() == 2
