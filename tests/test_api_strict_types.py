"""Issue 37: body fields take the JSON type their schema names, and the schema says what the server refuses.

A black-box run at 1,000 tenants found DRF's lax fields accepting ``{"pinned": 0}`` and ``"yes"`` as booleans and
``"900"`` as an integer (a customer token's ``ttl_s``; a rollout's ``canary``, ``wave_size``, ``soak_s``), and
three refusals the schema did not describe: ``{"pinned": true}`` with no release, a webhook URL ``https://[:]``,
and a release upload's ``default_config=0``. Each is a 400 problem naming the field, while what real clients send
(JSON booleans and integers) is still accepted; and each schema now refuses what the server refuses, read here
with a JSON Schema validator from the served schema.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.test import Client
from jsonschema import Draft202012Validator

from tests.conversation_helpers import post_json
from tests.vault.test_vault_helpers import assert_problem, make_tenant

pytestmark = pytest.mark.django_db


def put_json(client, path: str, data: object):  # type: ignore[no-untyped-def]
    return client.put(path, data=json.dumps(data), content_type="application/json")


def refused_field(response) -> list[str]:  # type: ignore[no-untyped-def]
    problem = assert_problem(response, 400)
    return [error["field"] for error in problem.get("errors", [])] or [problem.get("field", "")]


@pytest.fixture
def schema(db) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()


def body_schema(schema: dict, path: str, method: str, media: str = "application/json") -> Draft202012Validator:  # type: ignore[type-arg]
    """The operation's request body schema, its ``$ref``s resolved inside the served document."""
    ref = schema["paths"][path][method]["requestBody"]["content"][media]["schema"]
    return Draft202012Validator({**ref, "components": schema["components"]})


@pytest.mark.parametrize("pinned", [0, 1, "yes", "true", None])
def test_pinned_is_a_json_boolean(api, pinned):
    tenant = make_tenant(api.operator)
    assert refused_field(put_json(api, f"/api/v1/tenants/{tenant.pk}/release", {"pinned": pinned})) == ["pinned"]


def test_pinned_false_is_accepted_and_pinned_true_needs_a_release_in_the_schema_too(api, schema):
    tenant = make_tenant(api.operator)
    assert put_json(api, f"/api/v1/tenants/{tenant.pk}/release", {"pinned": False}).status_code == 202
    alone = put_json(api, f"/api/v1/tenants/{tenant.pk}/release", {"pinned": True})
    assert "pinning needs a release" in assert_problem(alone, 400)["detail"]
    # A release that is not one of ours: 404, not a 400 (the body was valid).
    other = put_json(api, f"/api/v1/tenants/{tenant.pk}/release", {"pinned": True, "release": str(uuid.uuid4())})
    assert_problem(other, 404)
    validator = body_schema(schema, "/api/v1/tenants/{tenant_id}/release", "put")
    assert not validator.is_valid({"pinned": True})
    assert not validator.is_valid({"pinned": True, "release": None})
    assert not validator.is_valid({"pinned": 0})
    assert validator.is_valid({"pinned": True, "release": str(uuid.uuid4())})
    assert validator.is_valid({"pinned": False}) and validator.is_valid({"pinned": False, "release": None})


@pytest.mark.parametrize("ttl_s", ["900", True, 900.5, [900]])
def test_customer_token_ttl_is_a_json_integer(api, ttl_s):
    tenant = make_tenant(api.operator)
    path = f"/api/v1/tenants/{tenant.pk}/customer-tokens"
    assert refused_field(post_json(api, path, {"scopes": ["tasks:read"], "ttl_s": ttl_s})) == ["ttl_s"]
    assert post_json(api, path, {"scopes": ["tasks:read"], "ttl_s": 900}).status_code == 201


@pytest.mark.parametrize("field,value", [("canary", "1"), ("canary", True), ("wave_size", "5"), ("soak_s", "0"),
                                         ("soak_s", False), ("canary_percent", "10")])
def test_rollout_numbers_are_json_numbers(api, field, value):
    body = {"release": str(uuid.uuid4())}
    assert refused_field(post_json(api, "/api/v1/rollouts", {**body, field: value})) == [field]
    # The same field as a JSON number gets past validation: the made-up release is then a 404.
    good = {"canary": 1, "wave_size": 5, "soak_s": 0, "canary_percent": 10}[field]
    assert_problem(post_json(api, "/api/v1/rollouts", {**body, field: good}), 404)


@pytest.mark.parametrize("field,value", [("trust_annotations", 0), ("trust_annotations", "false"),
                                         ("timeout_s", "30")])
def test_mcp_server_flags_are_json_types(api, field, value):
    body = {"name": "crm", "url": "https://mcp.example.com/mcp"}
    assert refused_field(post_json(api, "/api/v1/mcp-servers", {**body, field: value})) == [field]


def test_schedule_catch_up_max_is_a_json_integer(api):
    tenant = make_tenant(api.operator)
    body = {"name": "nightly", "cron": "0 3 * * *", "timezone": "UTC", "task": {"kind": "report"},
            "catch_up": "all", "catch_up_max": "3"}
    assert refused_field(post_json(api, f"/api/v1/tenants/{tenant.pk}/schedules", body)) == ["catch_up_max"]


@pytest.mark.parametrize("url,form_ok", [
    ("https://[:]/hook", False), ("https://[::::]/hook", False), ("https://[1:2:3:4:5:6:7:8:9]/", False),
    ("https://[0]/", False), ("https://[2001:db8::1]:8443/hook", True), ("https://[::ffff:192.0.2.1]/", True),
])
def test_a_bracketed_webhook_host_must_be_an_ipv6_address_in_the_schema_and_the_server(api, schema, url, form_ok):
    pattern = schema["components"]["schemas"]["EndpointCreateInputRequest"]["properties"]["url"]["pattern"]
    assert bool(re.search(pattern, url)) is form_ok
    response = post_json(api, "/api/v1/webhook-endpoints", {"url": url})
    # A well-formed documentation address is then refused by the SSRF guard (not public): a 400 no schema can say.
    detail = assert_problem(response, 400)["detail"]
    assert ("private or reserved" in detail) is form_ok, detail


@pytest.mark.parametrize("default_config", ["0", "[]", "null", '"{}"'])
def test_a_release_uploads_default_config_must_be_an_object_in_the_schema_and_the_server(api, schema,
                                                                                      default_config):
    field = schema["components"]["schemas"]["ReleaseUploadInputRequest"]["properties"]["default_config"]
    assert not re.search(field["pattern"], default_config)
    assert re.search(field["pattern"], ' {"max_refund": 100}\n')
    response = api.post("/api/v1/releases", {"file": _wheel(), "default_config": default_config},
                        format="multipart")
    assert refused_field(response) == ["default_config"]


def _wheel():  # type: ignore[no-untyped-def]
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("agent-1.0-py3-none-any.whl", b"PK\x03\x04not really a wheel")


def test_mcp_server_bodies_say_what_the_runtime_and_the_service_refuse(api, schema):
    from agent_runtime.mcp.config import KINDS

    validator = body_schema(schema, "/api/v1/mcp-servers", "post")
    base = {"name": "crm", "url": "https://mcp.example.com/mcp"}
    assert validator.is_valid({**base, "tools": {"lookup": "read_only", "refund": {"kind": "effect"},
                                                 "search": {"kind": "read_only", "ttl_s": 300}}})
    for tools in ({"x": "cached"}, {"x": {"kind": "effect", "ttl_s": 5}}, {"x": {"kind": "read_only", "ttl": 5}},
                  {"x": {"kind": "read_only", "ttl_s": 0}}, {"x": ["read_only"]}):
        assert not validator.is_valid({**base, "tools": tools}), tools
        # ...and the server refuses each the same (the runtime's rules, 400 naming the tool).
        assert_problem(post_json(api, "/api/v1/mcp-servers", {**base, "tools": tools}), 400)
    enum = validator.schema["components"]["schemas"]["McpServerCreateInputRequest"]["properties"]["tools"]
    assert enum["additionalProperties"]["anyOf"][0]["enum"] == list(KINDS)
    assert not validator.is_valid({**base, "credential": "crm-token", "connection": "google"})
    assert not validator.is_valid({**base, "url": "https://[:]/mcp"})
    assert refused_field(post_json(api, "/api/v1/mcp-servers", {**base, "url": "https://[:]/mcp"})) == ["url"]


def test_an_oauth_client_needs_an_issuer_or_both_endpoints_in_the_schema_too(api, schema):
    validator = body_schema(schema, "/api/v1/oauth-clients", "post")
    assert not validator.is_valid({"provider": "google", "client_id": "abc"})
    assert not validator.is_valid({"provider": "google", "client_id": "abc", "token_endpoint": "https://x.example/t"})
    assert validator.is_valid({"provider": "google", "client_id": "abc", "issuer": "https://accounts.example"})
    assert validator.is_valid({"provider": "google", "client_id": "abc", "authorization_endpoint": "https://x.example/a",
                               "token_endpoint": "https://x.example/t"})
    assert_problem(post_json(api, "/api/v1/oauth-clients", {"provider": "google", "client_id": "abc"}), 400)


def test_a_nul_in_an_mcp_tool_name_is_a_400_not_a_500(api, schema):
    """Found by the all-checks fuzz run once tool overrides were typed: the row's jsonb insert failed."""
    body = {"name": "crm", "url": "https://mcp.example.com/mcp", "tools": {"look\x00up": "read_only"}}
    assert refused_field(post_json(api, "/api/v1/mcp-servers", body)) == ["tools"]
    assert not body_schema(schema, "/api/v1/mcp-servers", "post").is_valid(body)


@pytest.mark.parametrize("end_user", ["u-alice", " u-alice", "u alice", "u-alice\n", "-u", "é"])
def test_an_end_user_id_the_schema_allows_is_accepted_and_one_it_refuses_is_refused(api, schema, end_user):
    """The end user's pattern is in the schema (``tenants.end_users``), kept as sent: an id the schema refuses is a
    400 naming ``end_user`` and one it allows is accepted (fuzzing found a schema-valid id refused)."""
    tenant = make_tenant(api.operator)
    valid = body_schema(schema, "/api/v1/tenants/{tenant_id}/customer-tokens", "post").is_valid(
        {"scopes": ["conversations:read"], "end_user": end_user})
    answer = post_json(api, f"/api/v1/tenants/{tenant.pk}/customer-tokens",
                       {"scopes": ["conversations:read"], "end_user": end_user})
    # (A final newline passes a pattern ending in "$" under Python's re, as jsonschema reads it: the server refuses it.)
    assert valid == (end_user in ("u-alice", "u-alice\n"))
    if end_user == "u-alice":
        assert answer.status_code == 201, answer.content
    else:
        assert refused_field(answer) == ["end_user"]


@pytest.mark.parametrize("host", ["api.example.com", "*.example.com", "*.com", "api.example.com:443", "a.example.",
                                  " a.example", "a.example\n", "not_a_host"])
def test_an_egress_host_the_schema_allows_is_accepted_and_one_it_refuses_is_refused(api, schema, host):
    valid = body_schema(schema, "/api/v1/egress-rules", "post").is_valid({"host": host})
    answer = post_json(api, "/api/v1/egress-rules", {"host": host})
    assert valid == (host in ("api.example.com", "*.example.com", "a.example\n"))
    if host in ("api.example.com", "*.example.com"):
        assert answer.status_code == 201, answer.content
    else:
        assert refused_field(answer) == ["host"]


def test_the_mcp_endpoint_says_its_body_is_required_and_refuses_an_empty_one(api, schema):
    """Its body is read raw (one JSON-RPC message), so the schema says it is required: an empty POST is then
    schema-invalid, as the server's parse error says (fuzzing found the two disagreeing)."""
    operation = schema["paths"]["/api/v1/tenants/{tenant_id}/mcp"]["post"]
    assert operation["requestBody"]["required"] is True
    assert not any(key.startswith("x-") for key in operation)  # the marker is consumed, not published
    tenant = make_tenant(api.operator)
    answer = api.post(f"/api/v1/tenants/{tenant.pk}/mcp", data=b"", content_type="application/json")
    assert answer.status_code == 400 and answer.json()["error"]["code"] == -32700


def test_the_connections_list_states_the_end_user_pattern_it_enforces(api, schema):
    parameters = schema["paths"]["/api/v1/tenants/{tenant_id}/connections"]["get"]["parameters"]
    (end_user,) = [p for p in parameters if p["name"] == "end_user"]
    pattern = end_user["schema"]["pattern"]
    tenant = make_tenant(api.operator)
    for value, allowed in (("u-alice", True), ("\u0100L\x02", False), ("u alice", False)):
        assert bool(re.search(pattern, value)) == allowed
        answer = api.get(f"/api/v1/tenants/{tenant.pk}/connections", {"end_user": value})
        assert (answer.status_code == 200) == allowed, (value, answer.content)
