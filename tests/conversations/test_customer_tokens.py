"""Customer tokens (ctk_...): minted by an operator for one tenant and some customer scopes; never another
tenant (404), never an operator endpoint (401), never after expiry or revocation (401); each refusal audited.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from conversations.models import CustomerToken
from tenants.models import AuditLog
from tests.conversation_helpers import post_json, stub_tenant
from tests.vault.test_vault_helpers import assert_problem, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(operator):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(operator)
    yield tenant, stub
    stub.stop()


def _mint(api, tenant, scopes=("conversations:read", "conversations:write"), **extra):  # type: ignore[no-untyped-def]
    return post_json(api, f"/api/v1/tenants/{tenant.pk}/customer-tokens", {"scopes": list(scopes), **extra})


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _refusals(tenant, reason: str) -> int:  # type: ignore[no-untyped-def]
    return AuditLog.objects.filter(action="customer_token.refused", tenant=tenant, data__reason=reason).count()


def test_mint_shows_the_token_once_and_stores_only_a_hash(api, chat):
    tenant, stub = chat
    resp = _mint(api, tenant, ttl_s=120)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["token"].startswith(f"ctk_{body['prefix']}_") and body["tenant"] == str(tenant.pk)
    assert resp["Cache-Control"] == "no-store"
    row = CustomerToken.objects.get(prefix=body["prefix"])
    secret = body["token"].split("_", 2)[2]
    assert secret not in row.secret_hash and row.scopes == ["conversations:read", "conversations:write"]
    assert 110 <= (row.expires_at - timezone.now()).total_seconds() <= 120
    audit = AuditLog.objects.get(action="customer_token.issue", tenant=tenant)
    assert secret not in str(audit.data) and audit.data["prefix"] == body["prefix"]


@pytest.mark.parametrize("body", [
    {"scopes": ["tenants:read"]},  # an operator scope
    {"scopes": ["effects:write"]},  # not delegable
    {"scopes": []},
    {"scopes": ["conversations:read"], "ttl_s": 86_401},
    {"scopes": ["conversations:read"], "ttl_s": 0},
    {"scopes": ["conversations:read"], "tenant": "other"},  # unknown field
])
def test_mint_refuses_bad_requests(api, chat, body):
    tenant, stub = chat
    assert_problem(post_json(api, f"/api/v1/tenants/{tenant.pk}/customer-tokens", body), 400)
    assert not CustomerToken.objects.exists()


def test_mint_needs_its_scope_and_cannot_delegate_what_the_operator_token_lacks(operator, make_token, chat):
    tenant, stub = chat
    assert_problem(_mint(_client(make_token(operator, ["tenants:read"])), tenant), 403)
    narrow = _client(make_token(operator, ["customer_tokens:write", "conversations:read"]))
    assert _mint(narrow, tenant, scopes=["conversations:read"]).status_code == 201
    assert_problem(_mint(narrow, tenant, scopes=["conversations:write"]), 400)


def test_a_customer_token_talks_to_its_own_tenant_within_its_scopes(api, chat):
    tenant, stub = chat
    customer = _client(_mint(api, tenant).json()["token"])
    sent = post_json(customer, f"/api/v1/tenants/{tenant.pk}/threads/web/messages", {"content": "hi"})
    assert sent.status_code == 201, sent.content
    assert customer.get(f"/api/v1/tenants/{tenant.pk}/threads/web/messages").status_code == 200
    assert customer.get(sent.json()["reply_url"], HTTP_ACCEPT="text/event-stream").status_code == 200
    # Scopes it was not given: 403.
    assert_problem(customer.get(f"/api/v1/tenants/{tenant.pk}/tasks"), 403)
    assert_problem(customer.get(f"/api/v1/tenants/{tenant.pk}/logs"), 403)
    assert_problem(customer.get(f"/api/v1/tenants/{tenant.pk}/effects"), 403)
    # Audited as the customer token.
    row = AuditLog.objects.get(action="conversation.message_send", tenant=tenant)
    assert row.actor_label.startswith("customer token ")


def test_another_tenant_is_404_and_audited(api, operator, chat):
    tenant, stub = chat
    sibling = make_tenant(operator)  # same operator, another customer
    customer = _client(_mint(api, tenant).json()["token"])
    for path in (f"/api/v1/tenants/{sibling.pk}/threads/web/messages", f"/api/v1/tenants/{sibling.pk}/tasks"):
        assert_problem(customer.get(path), 404)
    assert_problem(post_json(customer, f"/api/v1/tenants/{sibling.pk}/threads/web/messages", {"content": "x"}), 404)
    assert _refusals(tenant, "another tenant") == 3
    assert not sibling.inbox_items.exists()


@pytest.mark.parametrize("path", [
    "/api/v1/tenants",
    "/api/v1/tenants/{t}",
    "/api/v1/tenants/{t}/credentials",
    "/api/v1/tenants/{t}/credentials/mail",
    "/api/v1/tenants/{t}/recoveries",
])
def test_operator_endpoints_refuse_a_customer_token_with_401_and_audit(api, chat, path):
    tenant, stub = chat
    customer = _client(_mint(api, tenant).json()["token"])
    assert_problem(customer.get(path.format(t=tenant.pk)), 401)
    assert _refusals(tenant, "operator endpoint") == 1


def test_a_customer_token_cannot_mint_or_revoke_customer_tokens(api, chat):
    tenant, stub = chat
    minted = _mint(api, tenant).json()
    customer = _client(minted["token"])
    assert_problem(_mint(customer, tenant), 401)
    assert_problem(customer.delete(f"/api/v1/tenants/{tenant.pk}/customer-tokens/{minted['prefix']}"), 401)
    assert_problem(post_json(customer, "/api/v1/tenants", {"slug": "sneaky", "name": "Sneaky"}), 401)
    assert _refusals(tenant, "operator endpoint") == 3


def test_expired_and_revoked_tokens_are_401_and_audited(api, chat):
    tenant, stub = chat
    path = f"/api/v1/tenants/{tenant.pk}/threads/web/messages"
    expiring = _mint(api, tenant).json()
    CustomerToken.objects.filter(prefix=expiring["prefix"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_problem(_client(expiring["token"]).get(path), 401)
    assert _refusals(tenant, "expired") == 1
    revoked = _mint(api, tenant).json()
    assert _client(revoked["token"]).get(path).status_code in (200, 404)  # works (the thread is new: 404)
    assert api.delete(f"/api/v1/tenants/{tenant.pk}/customer-tokens/{revoked['prefix']}").status_code == 204
    assert_problem(_client(revoked["token"]).get(path), 401)
    assert _refusals(tenant, "revoked") == 1
    assert AuditLog.objects.filter(action="customer_token.revoke", tenant=tenant).count() == 1
    # A wrong secret on a real prefix is refused and audited; a made-up token is only refused.
    assert_problem(_client(f"ctk_{revoked['prefix']}_not-the-secret").get(path), 401)
    assert _refusals(tenant, "invalid") == 1
    assert_problem(_client("ctk_000000000000_whatever").get(path), 401)
    # A tenant on its way out takes its customer tokens with it.
    live = _mint(api, tenant).json()["token"]
    type(tenant).objects.filter(pk=tenant.pk).update(status="deprovisioning")
    assert_problem(_client(live).get(path), 401)
    assert _refusals(tenant, "tenant deprovisioned") == 1


def test_another_operator_cannot_mint_for_my_tenant(chat, make_token):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    tenant, stub = chat
    other = operator_create(slug="op-ctk-other", name="Other", actor=SYSTEM)
    assert_problem(_mint(_client(make_token(other)), tenant), 404)
