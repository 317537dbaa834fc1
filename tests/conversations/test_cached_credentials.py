"""A message's or task's POST may take its operator token and tenant from the process's cache (issue 39: the lookup
was a round trip of the hop); the write confirms them in its own statement (``tenants.tokens.Recheck``). Each test
first warms the cache with a request, changes what the cache took for granted the way another process would (a
revoke, a suspend, a plan), and shows the next write sees it as an uncached one would, with nothing written."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from conversations.models import InboxItem
from tenants import tokens
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import AuditLog, Plan, Tenant
from tenants.tokens import operator_token_revoke
from tests.conversation_helpers import post_json, stub_tenant

LOOKUP = "tenants_operatortoken k JOIN"  # the uncached verification's statement (``_verify_for_tenant``)


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _message(client: APIClient, tenant: Tenant, content: str = "hi", **headers: str):  # type: ignore[no-untyped-def]
    return post_json(client, f"/api/v1/tenants/{tenant.pk}/threads/t/messages", {"content": content}, **headers)


def _sends(tenant: Tenant) -> int:
    return AuditLog.objects.filter(tenant=tenant, action=AuditAction.CONVERSATION_MESSAGE_SEND).count()


@pytest.fixture
def warm(operator, make_token):  # type: ignore[no-untyped-def]
    """(tenant, stub, client, raw token) after one delivered message: the token is in the cache for the tenant."""
    tenant, stub = stub_tenant(operator)
    raw = make_token(operator)
    client = _client(raw)
    first = _message(client, tenant, "first")
    assert first.status_code == 201, first.content
    yield tenant, stub, client, raw
    stub.stop()


def test_the_second_message_is_authenticated_from_the_cache_and_confirmed_by_its_insert(warm):
    tenant, stub, client, _ = warm
    with CaptureQueriesContext(connection) as sent:
        second = _message(client, tenant, "second")
    assert second.status_code == 201, second.content
    statements = [q["sql"] for q in sent.captured_queries]
    assert not any(LOOKUP in s for s in statements), "the token was looked up again"
    insert = next(s for s in statements if "INSERT INTO" in s and "conversations_inboxitem" in s)
    assert "revoked_at IS NULL" in insert, "the insert confirms the cached token"
    assert len(stub.posts) == 2


def test_a_token_revoked_after_it_was_cached_writes_nothing_and_is_refused(warm, operator):
    tenant, stub, client, raw = warm
    operator_token_revoke(operator=operator, prefix=raw.split("_")[1], actor=SYSTEM)
    refused = _message(client, tenant, "after the revoke")
    assert refused.status_code == 401, refused.content
    assert refused["Content-Type"].startswith("application/problem+json")
    assert InboxItem.objects.filter(tenant=tenant).count() == 1
    assert _sends(tenant) == 1
    assert len(stub.posts) == 1
    task = post_json(client, f"/api/v1/tenants/{tenant.pk}/tasks", {"kind": "demo", "params": {}})
    assert task.status_code == 401, task.content
    assert InboxItem.objects.filter(tenant=tenant).count() == 1


def test_a_retried_key_after_a_revoke_is_refused_not_answered_from_the_inbox(operator, make_token):
    tenant, stub = stub_tenant(operator)
    raw = make_token(operator)
    client = _client(raw)
    try:
        assert _message(client, tenant, "keyed", **{"Idempotency-Key": "k-1"}).status_code == 201
        assert _message(client, tenant, "keyed", **{"Idempotency-Key": "k-1"}).status_code == 200  # a hit
        operator_token_revoke(operator=operator, prefix=raw.split("_")[1], actor=SYSTEM)
        retried = _message(client, tenant, "keyed", **{"Idempotency-Key": "k-1"})
    finally:
        stub.stop()
    assert retried.status_code == 401, retried.content
    assert "keyed" not in retried.content.decode()


def test_a_tenant_suspended_after_it_was_cached_holds_the_message(warm):
    tenant, stub, client, _ = warm
    Tenant.objects.filter(pk=tenant.pk).update(status=TenantStatus.SUSPENDED)  # as another process would
    held = _message(client, tenant, "while suspended")
    assert held.status_code == 202, held.content
    assert held.json()["inbox"]["status"] == "pending"
    assert len(stub.posts) == 1, "a suspended tenant's instance is not called"


def test_a_tenant_being_deleted_after_it_was_cached_is_not_found_and_nothing_is_written(warm):
    tenant, stub, client, _ = warm
    Tenant.objects.filter(pk=tenant.pk).update(status=TenantStatus.DEPROVISIONING)
    gone = _message(client, tenant, "too late")
    assert gone.status_code == 404, gone.content
    assert InboxItem.objects.filter(tenant=tenant).count() == 1
    assert _sends(tenant) == 1


def test_a_plan_changed_after_it_was_cached_applies_its_limit_at_once(warm):
    tenant, stub, client, _ = warm
    Plan.objects.create(slug="one-a-day", name="One a day", max_messages_per_day=1)
    Tenant.objects.filter(pk=tenant.pk).update(plan="one-a-day")
    limited = _message(client, tenant, "over the new limit")
    assert limited.status_code == 429, limited.content
    assert InboxItem.objects.filter(tenant=tenant).count() == 1


def test_another_operators_tenant_is_not_found_and_never_cached(operator, make_token):
    from tenants.services import operator_create

    other = operator_create(slug="op-cache-other", name="Other", actor=SYSTEM)
    theirs, stub = stub_tenant(other)
    raw = make_token(operator)
    try:
        for _ in range(2):
            answer = _message(_client(raw), theirs, "crossing")
            assert answer.status_code == 404, answer.content
    finally:
        stub.stop()
    assert not any(tenant_id == str(theirs.pk) for _, tenant_id in tokens._verified)
    assert not InboxItem.objects.filter(tenant=theirs).exists()
    assert stub.posts == []


def test_reads_are_never_answered_from_the_cache(warm, operator):
    tenant, stub, client, raw = warm
    with CaptureQueriesContext(connection) as sent:
        client.get(f"/api/v1/tenants/{tenant.pk}/tasks")
    assert any(LOOKUP in q["sql"] for q in sent.captured_queries)
    operator_token_revoke(operator=operator, prefix=raw.split("_")[1], actor=SYSTEM)
    assert client.get(f"/api/v1/tenants/{tenant.pk}/tasks").status_code == 401


def test_the_cache_is_bounded_and_its_entries_expire(operator, make_token, monkeypatch):
    tenant, stub = stub_tenant(operator)
    stub.stop()
    raws = [make_token(operator) for _ in range(3)]
    monkeypatch.setattr(tokens, "_verified", {})
    monkeypatch.setattr(tokens, "VERIFIED_CACHE_MAX", 2)
    for raw in raws:
        assert tokens.operator_token_verify_for_tenant_cached(raw, tenant.pk)[2] is None  # a miss, verified now
    assert len(tokens._verified) == 2
    assert tokens.operator_token_verify_for_tenant_cached(raws[0], tenant.pk)[2] is None, "the oldest was dropped"
    hit = tokens.operator_token_verify_for_tenant_cached(raws[2], tenant.pk)[2]
    assert hit is not None and hit.tenant_id == tenant.pk and hit.holds()
    monkeypatch.setattr(tokens, "VERIFIED_CACHE_TTL_S", 0.0)
    tokens.operator_token_verify_for_tenant_cached(raws[1], tenant.pk)  # kept with no time to live
    assert tokens.operator_token_verify_for_tenant_cached(raws[1], tenant.pk)[2] is None, "expired"


def test_a_hit_builds_fresh_instances_that_share_nothing_with_the_cache(operator, make_token, monkeypatch):
    tenant, stub = stub_tenant(operator)
    stub.stop()
    raw = make_token(operator)
    monkeypatch.setattr(tokens, "_verified", {})
    tokens.operator_token_verify_for_tenant_cached(raw, tenant.pk)
    first, first_tenant, _ = tokens.operator_token_verify_for_tenant_cached(raw, tenant.pk)
    assert first is not None and first_tenant is not None
    first.scopes.append("mutated")
    first_tenant.status = "mutated"
    again, again_tenant, recheck = tokens.operator_token_verify_for_tenant_cached(raw, tenant.pk)
    assert recheck is not None, "a hit"
    assert again is not first and "mutated" not in again.scopes
    assert again_tenant is not None and again_tenant.status == tenant.status
