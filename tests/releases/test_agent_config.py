"""Issue 32, "configuration with a schema": a release declares the JSON Schema of its configuration, the operator
overrides it per customer (validated, audited, credential names only), and the effective configuration reaches
``ctx.config`` inside a real instance, asked per task from the control plane.

Real wheels through the real upload (pip install, the sandboxed probe), real PostgreSQL, and for the end-to-end
test a live web server, a real Celery worker and a real ``agent-host``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg import sql
from rest_framework.test import APIClient

from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.fleet.instances import instance_submit_task
from provisioning.models import ProvisionedResource
from releases.assignments import release_default_set
from releases.models import AgentRelease, TenantAgentConfig
from releases.services import release_create
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from tenants.tokens import operator_token_issue
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.releases.test_releases_upload import make_wheel, upload
from tests.vault.test_vault_helpers import assert_problem, make_instance, make_tenant
from vault.services import credential_put, credential_revoke

SECRET = "refund-key-7f3a9c1d-never-shown"

SCHEMA = {
    "type": "object",
    "properties": {
        "greeting": {"type": "string", "minLength": 1},
        "max_refund": {"type": "integer", "minimum": 0, "maximum": 1000},
        "currency": {"enum": ["EUR", "USD"]},
        "api_key": {"type": "string", "format": "credential"},
    },
    "required": ["greeting"],
    "additionalProperties": False,
}

AGENT = '''
import hashlib

from agent_runtime.sdk import Agent

agent = Agent("configured", config_schema={schema})
refunds = Agent("refunds", config_schema={other})


@agent.step
def look(ctx):
    out = {{"config": dict(ctx.config)}}
    if ctx.config.get("api_key"):
        out["secret_sha"] = hashlib.sha256(ctx.config_credential("api_key").value.encode()).hexdigest()
    return out


@refunds.step
def noop(ctx):
    return True
'''
ENTRY_POINTS = "[agent_runtime.agents]\nconfigured = configured_agent:agent\nrefunds = configured_agent:refunds\n"
# The second kind declares the same property as the first, identically: merged, not a conflict.
OTHER = {"type": "object", "properties": {"max_refund": SCHEMA["properties"]["max_refund"],
                                          "region": {"type": "string"}}}


def _wheel(version: str, *, other: dict[str, Any] | None = None,
           schema: dict[str, Any] | None = None) -> tuple[str, bytes]:
    module = AGENT.format(schema=repr(schema or SCHEMA), other=repr(other if other is not None else OTHER))
    return make_wheel("configured-agent", version, module=module, entry_points=ENTRY_POINTS)


def _put(client: APIClient, tenant_id: object, overrides: object):  # type: ignore[no-untyped-def]
    return client.put(f"/api/v1/tenants/{tenant_id}/agent-config", data=json.dumps({"overrides": overrides}),
                      content_type="application/json")


@pytest.fixture
def local_releases(tmp_path, settings):  # type: ignore[no-untyped-def]
    settings.RELEASES_ROOT = tmp_path / "releases"
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60


@pytest.fixture
def configured(api, local_releases):  # type: ignore[no-untyped-def]
    """Operator A's release with the schema, made its default, and a customer of A on it."""
    filename, data = _wheel("1.0.0")
    created = upload(api, filename, data, default_config=json.dumps({"greeting": "Hello", "max_refund": 100}))
    assert created.status_code == 201, created.content
    assert api.put("/api/v1/releases/default", data={"release": created.json()["id"]}, format="json").status_code == 200
    return make_tenant(api.operator), created.json()


@pytest.mark.django_db
def test_the_schema_comes_from_the_wheel_merged_across_its_agents(configured) -> None:  # type: ignore[no-untyped-def]
    _tenant, release = configured
    expected = {**SCHEMA["properties"], "region": {"type": "string"}}
    assert release["config_schema"]["properties"] == expected
    assert release["config_schema"]["required"] == ["greeting"]
    # One agent closes its schema: the release's configuration then holds only what some agent declares.
    assert release["config_schema"]["additionalProperties"] is False
    assert AgentRelease.objects.get(pk=release["id"]).config_schema == release["config_schema"]
    assert release["default_config"] == {"greeting": "Hello", "max_refund": 100}


@pytest.mark.django_db
def test_an_invalid_default_or_a_conflicting_schema_refuses_the_upload(api, local_releases) -> None:  # type: ignore[no-untyped-def]
    filename, data = _wheel("1.0.0")
    bad = assert_problem(upload(api, filename, data, default_config=json.dumps({"greeting": "Hi", "max_refund": 5000})),
                         400)
    assert bad["field"] == "default_config.max_refund" and "maximum of 1000" in bad["detail"], bad
    missing = assert_problem(upload(api, filename, data, default_config=json.dumps({"max_refund": 1})), 400)
    assert missing["field"] == "default_config.greeting", missing
    conflicting = _wheel("2.0.0", other={"type": "object", "properties": {"max_refund": {"type": "string"}}})
    clash = assert_problem(upload(api, *conflicting, default_config=json.dumps({"greeting": "Hi"})), 400)
    assert "'max_refund'" in clash["detail"] and "'configured'" in clash["detail"] and "'refunds'" in clash["detail"]
    assert not AgentRelease.objects.exists()
    # Without a schema any JSON object is accepted, as before.
    plain = make_wheel()
    created = upload(api, *plain, default_config=json.dumps({"anything": [1, {"x": None}]}))
    assert created.status_code == 201 and created.json()["config_schema"] is None


@pytest.mark.django_db
def test_overrides_are_validated_naming_the_field_and_audited(api, configured) -> None:  # type: ignore[no-untyped-def]
    tenant, release = configured
    shown = api.get(f"/api/v1/tenants/{tenant.pk}/agent-config").json()
    assert shown["effective"] == {"greeting": "Hello", "max_refund": 100} and shown["overrides"] == {}
    assert shown["release"]["id"] == release["id"] and shown["credential_fields"] == ["api_key"]

    for overrides, field in (({"max_refund": -1}, "overrides.max_refund"), ({"currency": "GBP"}, "overrides.currency"),
                             ({"greeting": ""}, "overrides.greeting"), ({"colour": "red"}, "overrides.colour"),
                             ({"max_refund": "ten"}, "overrides.max_refund")):
        refused = assert_problem(_put(api, tenant.pk, overrides), 400)
        assert refused["field"] == field, (overrides, refused)
        assert refused["detail"].startswith(field), refused
    assert not TenantAgentConfig.objects.filter(tenant=tenant).exists()

    done = _put(api, tenant.pk, {"max_refund": 250, "currency": "EUR"})
    assert done.status_code == 200, done.content
    assert done.json()["effective"] == {"greeting": "Hello", "max_refund": 250, "currency": "EUR"}
    assert done.json()["overrides"] == {"max_refund": 250, "currency": "EUR"}
    row = AuditLog.objects.filter(action="agent_config.update", tenant_id=tenant.pk).get()
    assert row.data["keys"] == ["currency", "max_refund"] and "250" not in json.dumps(row.data)
    # The whole set is replaced: a key left out goes back to the release default.
    assert _put(api, tenant.pk, {"currency": "USD"}).json()["effective"]["max_refund"] == 100


@pytest.mark.django_db
def test_a_credential_property_holds_a_vault_name_and_never_a_value(api, configured) -> None:  # type: ignore[no-untyped-def]
    tenant, _release = configured
    refused = assert_problem(_put(api, tenant.pk, {"api_key": "refund-api"}), 400)
    assert refused["field"] == "overrides.api_key" and "no credential named 'refund-api'" in refused["detail"]
    credential_put(tenant=tenant, name="refund-api", value=SECRET, actor=SYSTEM)
    answers = [_put(api, tenant.pk, {"api_key": "refund-api"}), api.get(f"/api/v1/tenants/{tenant.pk}/agent-config")]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1].json()["effective"]["api_key"] == "refund-api"
    instance = APIClient()
    instance.credentials(HTTP_AUTHORIZATION=f"Bearer {make_instance(tenant)}")
    delivered = instance.get("/internal/v1/agent-config")
    assert delivered.json()["config"]["api_key"] == "refund-api" and delivered["Cache-Control"] == "no-store"
    for answer in (*answers, delivered):
        assert SECRET not in answer.content.decode()
    # A revoked credential cannot be named anew (the stored reference stays: the agent meets the revocation).
    credential_revoke(tenant=tenant, name="refund-api", actor=SYSTEM)
    assert_problem(_put(api, tenant.pk, {"api_key": "refund-api", "max_refund": 1}), 400)


@pytest.mark.django_db
def test_another_operator_cannot_read_or_write_a_customers_configuration(api, configured, make_token) -> None:  # type: ignore[no-untyped-def]
    tenant, _release = configured
    assert _put(api, tenant.pk, {"max_refund": 7}).status_code == 200
    operator_b = operator_create(slug="cfg-b", name="B", actor=SYSTEM)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator_b)}")
    assert_problem(other.get(f"/api/v1/tenants/{tenant.pk}/agent-config"), 404)
    assert_problem(_put(other, tenant.pk, {"max_refund": 8}), 404)
    assert TenantAgentConfig.objects.get(tenant=tenant).overrides == {"max_refund": 7}
    # B's instance asks for its own tenant's configuration and gets only that (nothing of A's).
    b_tenant = make_tenant(operator_b)
    b_instance = APIClient()
    b_instance.credentials(HTTP_AUTHORIZATION=f"Bearer {make_instance(b_tenant)}")
    assert b_instance.get("/internal/v1/agent-config").json()["config"] == {}


def _query(tenant: Tenant, text: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        return conn.execute(sql.SQL(text).format(s=sql.Identifier(tenant.resource_name)), args).fetchall()


def _run(tenant: Tenant) -> dict[str, Any]:
    task_id = instance_submit_task(tenant=tenant, kind="configured", params={}, actor=SYSTEM)

    def finished() -> str | None:
        status = _query(tenant, "SELECT status FROM {s}.tasks WHERE id = %s", task_id)[0][0]
        return status if status in ("done", "failed", "blocked") else None

    assert wait_for(finished, timeout=90, what="the task finished") == "done"
    rows = _query(tenant, "SELECT value FROM {s}.case_entries WHERE task_id = %s AND kind = 'done' AND key = 'look'",
                  task_id)
    recorded = _query(tenant, "SELECT agent_config FROM {s}.tasks WHERE id = %s", task_id)[0][0]
    assert rows[0][0]["config"] == recorded  # what the task ran with is what its row keeps for a replay
    return dict(rows[0][0])


@pytest.mark.django_db(transaction=True)
def test_an_override_and_a_credential_reach_ctx_config_in_a_real_instance(live_server, worker_factory,  # type: ignore[no-untyped-def]
                                                                          settings) -> None:
    # Under the control plane's var/ (the instance's sandbox binds its own release back in), shared with the worker.
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    operator = operator_create(slug=f"cfg-{secrets.token_hex(3)}", name="Config operator", actor=SYSTEM)
    release = release_create(operator=operator, actor=SYSTEM, default_config={"greeting": "Hello", "max_refund": 100},
                             **dict(zip(("filename", "data"), _wheel(f"1.0.{secrets.randbelow(10**6)}"),
                                        strict=True)))
    release_default_set(operator=operator, release_id=release.pk, actor=SYSTEM)
    worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, RELEASES_ROOT=str(root))
    try:
        tenant = onboard_ready(operator, f"cfg-{secrets.token_hex(3)}")
        credential_put(tenant=tenant, name="refund-api", value=SECRET, actor=SYSTEM)
        client = APIClient()
        token = operator_token_issue(operator=operator, actor=SYSTEM).plaintext
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        assert _put(client, tenant.pk, {"max_refund": 250, "api_key": "refund-api"}).status_code == 200
        pid = ProvisionedResource.objects.get(tenant=tenant, kind="runtime").details["pid"]

        first = _run(tenant)
        assert first["config"] == {"greeting": "Hello", "max_refund": 250, "api_key": "refund-api"}
        # The value came from the vault inside the instance; neither the configuration nor the case file holds it.
        assert first["secret_sha"] == hashlib.sha256(SECRET.encode()).hexdigest()
        assert SECRET not in json.dumps(first)

        # A change reaches the next task without a restart.
        assert _put(client, tenant.pk, {"greeting": "Bonjour"}).status_code == 200
        second = _run(tenant)
        assert second["config"] == {"greeting": "Bonjour", "max_refund": 100}
        assert ProvisionedResource.objects.get(tenant=tenant, kind="runtime").details["pid"] == pid
        assert psutil.pid_exists(pid)
        for answer in (client.get(f"/api/v1/tenants/{tenant.pk}/agent-config"),
                       client.get(f"/api/v1/releases/{release.pk}")):
            assert answer.status_code == 200 and SECRET not in answer.content.decode()
    finally:
        kill_session_instances()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.django_db
def test_the_portal_form_is_generated_from_the_schema_and_saves_through_the_service() -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from portal.models import OperatorMembership

    host = "cfg-portal.localhost"
    operator = operator_create(slug="cfg-portal", name="Portal op", actor=SYSTEM, domains=[host])
    release = AgentRelease.objects.create(operator=operator, version="1.0.0", distribution="configured-agent",
                                          digest="sha256:" + "cd" * 32, filename="c.whl", size_bytes=1,
                                          artifact_key="x", kinds={"configured": ""}, config_schema=SCHEMA,
                                          default_config={"greeting": "Hello"})
    release_default_set(operator=operator, release_id=release.pk, actor=SYSTEM)
    tenant = make_tenant(operator)
    credential_put(tenant=tenant, name="refund-api", value=SECRET, actor=SYSTEM)
    clients = {}
    for role in ("admin", "member"):
        user = User.objects.create_user(f"cfg-{role}", password="correct horse battery staple")
        OperatorMembership.objects.create(user=user, operator=operator, role=role)
        clients[role] = Client(HTTP_HOST=host)
        clients[role].force_login(user)

    page = clients["admin"].get(f"/customers/{tenant.pk}/").content.decode()
    assert 'data-testid="agent-config-card"' in page
    assert 'type="number" name="max_refund"' in page and 'name="greeting"' in page
    assert '<option value="&quot;EUR&quot;">EUR</option>' in page  # an enum is a choice
    assert '<option value="refund-api">refund-api</option>' in page and SECRET not in page  # a vault name, no value

    url = f"/customers/{tenant.pk}/agent-config/"
    form = {"greeting": "", "max_refund": "5000", "currency": "", "api_key": ""}
    refused = clients["admin"].post(url, form)
    assert refused.status_code == 400 and "overrides.max_refund" in refused.content.decode()
    assert clients["member"].post(url, {**form, "max_refund": "50"}).status_code == 403
    saved = clients["admin"].post(url, {**form, "max_refund": "50", "currency": '"USD"', "api_key": "refund-api"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert TenantAgentConfig.objects.get(tenant=tenant).overrides == {"max_refund": 50, "currency": "USD",
                                                                     "api_key": "refund-api"}
    assert AuditLog.objects.filter(action="agent_config.update", tenant_id=tenant.pk).count() == 1
    # The reserved `effects` key has its own JSON field: a save keeps the customer's providers, and a refusal
    # of the runtime's check is shown on it.
    effects = {"payment": {"type": "http", "url": "https://pay.example/v1/charges"}}
    assert 'name="effects"' in clients["admin"].get(f"/customers/{tenant.pk}/").content.decode()
    bad = clients["admin"].post(url, {**form, "max_refund": "50", "effects": json.dumps({"payment": {"type": "http"}})})
    assert bad.status_code == 400 and "overrides.effects.payment.url" in bad.content.decode()
    assert clients["admin"].post(url, {**form, "max_refund": "60", "effects": json.dumps(effects)}).status_code == 302
    assert TenantAgentConfig.objects.get(tenant=tenant).overrides == {"max_refund": 60, "effects": effects}
    page = clients["admin"].get(f"/customers/{tenant.pk}/").content.decode()
    assert clients["admin"].post(url, {**form, "max_refund": "70", "effects": json.dumps(effects)}).status_code == 302
    assert TenantAgentConfig.objects.get(tenant=tenant).overrides["effects"] == effects
    assert "pay.example" in page  # shown back in its field, so the next save sends it again


@pytest.mark.django_db
def test_an_image_release_declares_its_schema_in_its_body(api, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PROVISIONING_PROFILE = "kubernetes"
    body = {"image": "registry.example.com/acme/agent@sha256:" + "4f" * 32, "version": "1.4.0",
            "kinds": {"configured": ""}, "config_schema": SCHEMA}
    bad = assert_problem(api.post("/api/v1/releases", {**body, "default_config": {"greeting": 3}}, format="json"), 400)
    assert bad["field"] == "default_config.greeting", bad
    broken = {**SCHEMA, "properties": {"greeting": {"type": "no-such-type"}}}
    invalid = assert_problem(api.post("/api/v1/releases", {**body, "config_schema": broken}, format="json"), 400)
    assert "not a valid JSON Schema" in invalid["detail"], invalid
    created = api.post("/api/v1/releases", {**body, "default_config": {"greeting": "Hi"}}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["config_schema"]["properties"] == SCHEMA["properties"]


@pytest.mark.django_db
def test_an_effects_override_is_checked_by_the_runtimes_rules_naming_the_field(api, configured) -> None:  # type: ignore[no-untyped-def]
    """The reserved key `effects` names the customer's own providers (issue 32): a closed schema does not refuse
    it, and `python -m agent_runtime.effects.check` does, naming the field, when the runtime could not build it."""
    tenant, _release = configured
    for effects, field in (
            ({"payment": {"type": "http"}}, "overrides.effects.payment.url"),
            ({"payment": {"type": "http", "url": "file:///etc/passwd"}}, "overrides.effects.payment.url"),
            ({"payment": {"type": "fax", "url": "https://pay.example"}}, "overrides.effects.payment.type"),
            ({"payment": {"type": "http", "url": "https://pay.example", "lookup_consistency_s": -1}},
             "overrides.effects.payment.lookup_consistency_s"),
            ({"payment": {"type": "http", "url": "https://pay.example", "api_key": "sk_live_x"}},
             "overrides.effects.payment.api_key"),
            ({"email": {"type": "smtp", "url": "https://mail.example"}}, "overrides.effects.email.url"),
            ({"hook": {"type": "webhook", "url": "https://hooks.example"}}, "overrides.effects.hook.secret_credential"),
            ({"payment": "https://pay.example"}, "overrides.effects.payment"),
            (["payment"], "overrides.effects")):
        refused = assert_problem(_put(api, tenant.pk, {"effects": effects}), 400)
        assert refused["field"] == field, (effects, refused)
        assert refused["detail"].startswith(field), refused
    assert not TenantAgentConfig.objects.filter(tenant=tenant).exists()

    effects = {"payment": {"type": "http", "url": "https://pay.acme.example/v1/charges",
                           "bearer_credential": "acme-pay"},
               "email": {"type": "smtp", "url": "smtps://agent:acme-smtp@mail.acme.example:465"},
               "hook": {"type": "webhook", "url": "https://hooks.acme.example", "secret_credential": "acme-hook"}}
    # Each credential it names must be in the customer's vault, as for a "format": "credential" property; the
    # refusal names the field and the name, never anything else of the vault.
    for name, field in (("acme-smtp", "overrides.effects.email.url"),
                        ("acme-hook", "overrides.effects.hook.secret_credential"),
                        ("acme-pay", "overrides.effects.payment.bearer_credential")):
        refused = assert_problem(_put(api, tenant.pk, {"effects": effects}), 400)
        assert refused["field"] == field and repr(name) in refused["detail"], refused
        credential_put(tenant=tenant, name=name, value=f"{name}-secret", actor=SYSTEM)
        assert f"{name}-secret" not in json.dumps(refused)
    done = _put(api, tenant.pk, {"effects": effects})
    assert done.status_code == 200, done.content
    assert done.json()["effective"] == {"greeting": "Hello", "max_refund": 100, "effects": effects}


@pytest.mark.django_db
def test_an_mcp_override_is_checked_by_the_runtimes_rules_naming_the_field(api, configured) -> None:  # type: ignore[no-untyped-def]
    """The reserved key `mcp` names the customer's MCP servers (issue 34): a closed schema does not refuse it, and
    `python -m agent_runtime.mcp.check` does, naming the field, when the runtime could not use it."""
    tenant, _release = configured
    for servers, field in (
            ({"crm": {"url": "crm.example"}}, "overrides.mcp.crm.url"),
            ({"crm": {"url": "https://crm.example/mcp", "token": "s3cret"}}, "overrides.mcp.crm.token"),
            ({"crm": {"url": "https://crm.example/mcp", "tools": {"pay": "sometimes"}}},
             "overrides.mcp.crm.tools.pay.kind"),
            (["crm"], "overrides.mcp")):
        refused = assert_problem(_put(api, tenant.pk, {"mcp": servers}), 400)
        assert refused["field"] == field, (servers, refused)
    assert not TenantAgentConfig.objects.filter(tenant=tenant).exists()
    servers = {"crm": {"url": "https://crm.acme.example/mcp", "credential": "acme-crm", "tools": {"pay": "effect"}}}
    # The credential it names must be in the customer's vault, as an effect's must.
    refused = assert_problem(_put(api, tenant.pk, {"mcp": servers}), 400)
    assert refused["field"] == "overrides.mcp.crm.credential" and "'acme-crm'" in refused["detail"], refused
    credential_put(tenant=tenant, name="acme-crm", value="acme-crm-secret", actor=SYSTEM)
    done = _put(api, tenant.pk, {"mcp": servers})
    assert done.status_code == 200, done.content
    assert done.json()["effective"] == {"greeting": "Hello", "max_refund": 100, "mcp": servers}


@pytest.mark.django_db
def test_a_releases_default_effects_are_checked_on_upload(api, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PROVISIONING_PROFILE = "kubernetes"
    body = {"image": "registry.example.com/acme/agent@sha256:" + "4f" * 32, "version": "1.4.0",
            "kinds": {"configured": ""}, "config_schema": SCHEMA}
    bad = assert_problem(api.post("/api/v1/releases", {**body, "default_config": {
        "greeting": "Hi", "effects": {"payment": {"type": "http", "url": ""}}}}, format="json"), 400)
    assert bad["field"] == "default_config.effects.payment.url", bad
    good = {"greeting": "Hi", "effects": {"payment": {"type": "http", "url": "https://pay.example/v1/charges"}}}
    created = api.post("/api/v1/releases", {**body, "default_config": good}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["default_config"] == good


@pytest.mark.django_db(transaction=True)
def test_a_release_the_customers_configuration_does_not_fit_is_refused_on_a_pin_and_skipped_by_a_rollout(
        api, configured) -> None:  # type: ignore[no-untyped-def]
    """Overrides were valid for the release the customer ran when they were written; a release whose schema
    refuses them would hand the agent a configuration its own schema rejects, so a switch checks first."""
    from releases.assignments import tenant_release_seen
    from releases.models import ReleaseAssignment, RolloutItem
    from releases.rollouts import rollout_create, rollout_execute

    tenant, v1 = configured
    Tenant.objects.filter(pk=tenant.pk).update(status="ready")
    assert _put(api, tenant.pk, {"currency": "EUR"}).status_code == 200
    usd_only = {**SCHEMA, "properties": {**SCHEMA["properties"], "currency": {"enum": ["USD"]}}}
    filename, data = _wheel("2.0.0", schema=usd_only)
    v2 = upload(api, filename, data, default_config=json.dumps({"greeting": "Hello"}))
    assert v2.status_code == 201, v2.content

    refused = assert_problem(api.put(f"/api/v1/tenants/{tenant.pk}/release",
                                     data={"release": v2.json()["id"], "pinned": True}, format="json"), 400)
    assert refused["field"] == "overrides.currency" and "2.0.0" in refused["detail"], refused
    assert str(tenant_release_seen(tenant).release_id) == v1["id"]

    rollout = rollout_create(operator=api.operator, release_id=v2.json()["id"], actor=SYSTEM, canary=1, soak_s=0)
    rollout_execute(str(rollout.pk))
    (item,) = RolloutItem.objects.filter(rollout=rollout)
    assert item.status == "skipped" and "overrides.currency" in item.error, (item.status, item.error)
    assert str(tenant_release_seen(tenant).release_id) == v1["id"]  # left on its release

    # Once its overrides fit (the override removed), the pin goes through.
    assert _put(api, tenant.pk, {}).status_code == 200
    pinned = api.put(f"/api/v1/tenants/{tenant.pk}/release", data={"release": v2.json()["id"], "pinned": True},
                     format="json")
    assert pinned.status_code == 202, pinned.content  # accepted: a worker restarts the instance on it
    assignment = ReleaseAssignment.objects.get(tenant=tenant)
    assert str(assignment.release_id) == v2.json()["id"] and assignment.retained == [v1["id"]]


@pytest.mark.django_db
def test_the_instances_configuration_costs_three_statements(api, configured,  # type: ignore[no-untyped-def]
                                                             django_assert_num_queries) -> None:
    """Every instance asks once per task (issue 39): its token with its tenant and operator in one statement, the
    release with the overrides in one, the MCP servers in one (the ORM's four cost ~4x the CPU). What it answers is
    what the ORM built: JSON parsed, overrides over defaults, a customer's MCP entry over the operator's of the
    same name."""
    from mcp_servers.services import mcp_server_create
    from releases.assignments import tenant_release_initial

    tenant, _release = configured
    tenant_release_initial(tenant=tenant)  # what a started instance has: its assignment recorded
    assert _put(api, tenant.pk, {"greeting": "Hi"}).status_code == 200
    mcp_server_create(operator=tenant.operator, tenant=None, actor=SYSTEM, name="crm", url="https://op.example/mcp",
                      tools={"search": "read_only"})
    mcp_server_create(operator=tenant.operator, tenant=tenant, actor=SYSTEM, name="crm",
                      url="https://own.example/mcp", allowed_tools=["search"])
    mcp_server_create(operator=tenant.operator, tenant=None, actor=SYSTEM, name="docs", url="https://docs.example/mcp")
    instance = APIClient()
    instance.credentials(HTTP_AUTHORIZATION=f"Bearer {make_instance(tenant)}")
    with django_assert_num_queries(3):
        answer = instance.get("/internal/v1/agent-config")
    config = answer.json()["config"]
    assert (config["greeting"], config["max_refund"]) == ("Hi", 100)
    assert config["mcp"]["crm"]["url"] == "https://own.example/mcp"
    assert config["mcp"]["crm"]["allowed_tools"] == ["search"]
    assert config["mcp"]["docs"]["url"] == "https://docs.example/mcp"
