"""The control plane's side of thread policies (issue 35), against the instance protocol stub: the thread's
policy is stored, validated and audited; a message's policy overrides it and reaches the instance only when it is
not `enqueue`; `reject` is decided before the inbox when a message of the thread still waits in it; the
Idempotency-Key fingerprint covers what the request said, not the thread's policy at the time. Each policy's
behaviour against a real instance is tests/conversations/test_thread_policies.py."""

from __future__ import annotations

import json

import pytest

from conversations.models import InboxItem
from conversations.services import _request_for
from tenants.models import AuditLog
from tests.conversation_helpers import post_json, stub_tenant
from tests.vault.test_vault_helpers import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(operator):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(operator)
    yield tenant, stub
    stub.stop()


def _thread(tenant, name: str = "t1") -> str:  # type: ignore[no-untyped-def]
    return f"/api/v1/tenants/{tenant.pk}/threads/{name}"


def _put(api, url: str, body: object):  # type: ignore[no-untyped-def]
    return api.put(url, data=json.dumps(body), content_type="application/json")


def test_a_threads_policy_is_stored_validated_and_audited(api, chat):
    tenant, _ = chat
    assert api.get(_thread(tenant)).json() == {"thread": "t1", "policy": "enqueue"}
    assert_problem(_put(api, _thread(tenant), {"policy": "sometimes"}), 400)
    assert_problem(_put(api, _thread(tenant), {"policy": "reject", "is_admin": True}), 400)
    assert_problem(_put(api, _thread(tenant), {}), 400)
    assert_problem(_put(api, _thread(tenant, "no spaces"), {"policy": "reject"}), 400)
    assert not AuditLog.objects.filter(action="conversation.thread_policy_set").exists()

    assert _put(api, _thread(tenant), {"policy": "interrupt"}).json() == {"thread": "t1", "policy": "interrupt"}
    assert _put(api, _thread(tenant), {"policy": "rollback"}).status_code == 200
    assert api.get(_thread(tenant)).json()["policy"] == "rollback"
    assert api.get(_thread(tenant, "t2")).json()["policy"] == "enqueue"  # per thread
    rows = AuditLog.objects.filter(action="conversation.thread_policy_set", tenant=tenant).order_by("id")
    assert [(r.data["before"], r.data["policy"]) for r in rows] == [("enqueue", "interrupt"),
                                                                   ("interrupt", "rollback")]


def test_a_messages_policy_overrides_the_threads_and_only_a_non_default_one_is_sent(api, chat):
    tenant, stub = chat
    assert_problem(post_json(api, _thread(tenant) + "/messages", {"content": "hi", "policy": "never"}), 400)
    _put(api, _thread(tenant), {"policy": "interrupt"})
    by_thread = post_json(api, _thread(tenant) + "/messages", {"content": "one"})
    by_request = post_json(api, _thread(tenant) + "/messages", {"content": "two", "policy": "enqueue"})
    assert (by_thread.status_code, by_request.status_code) == (201, 201)
    first = InboxItem.objects.get(pk=by_thread.json()["inbox"]["id"])
    second = InboxItem.objects.get(pk=by_request.json()["inbox"]["id"])
    assert _request_for(first)[1] == {"id": str(first.pk), "content": "one", "policy": "interrupt"}
    assert _request_for(second)[1] == {"id": str(second.pk), "content": "two"}  # what instances before policies take
    audit = AuditLog.objects.filter(action="conversation.message_send", tenant=tenant).order_by("id")
    assert [r.data["policy"] for r in audit] == ["interrupt", "enqueue"]


def test_a_retry_is_answered_whatever_the_threads_policy_became_and_another_policy_is_another_body(api, chat):
    tenant, _ = chat
    url = _thread(tenant) + "/messages"
    first = post_json(api, url, {"content": "pay 5"}, **{"Idempotency-Key": "p-1"})
    assert first.status_code == 201
    _put(api, _thread(tenant), {"policy": "reject"})
    again = post_json(api, url, {"content": "pay 5"}, **{"Idempotency-Key": "p-1"})
    assert again.status_code == 200 and again.json()["inbox"]["id"] == first.json()["inbox"]["id"]
    assert_problem(post_json(api, url, {"content": "pay 5", "policy": "interrupt"}, **{"Idempotency-Key": "p-1"}),
                   422)


def test_reject_refuses_before_the_inbox_while_a_message_of_the_thread_waits_in_it(api, chat):
    tenant, stub = chat
    stub.stop()  # the instance is down: the first message waits in the inbox (202)
    url = _thread(tenant) + "/messages"
    waiting = post_json(api, url, {"content": "first"}, **{"Idempotency-Key": "w-1"})
    assert waiting.status_code == 202, waiting.content
    count = InboxItem.objects.filter(tenant=tenant).count()
    refused = assert_problem(post_json(api, url, {"content": "second", "policy": "reject"}), 409)
    assert refused["code"] == "thread_busy" and refused["type"].endswith("/thread-busy")
    assert refused["task"] == {"id": waiting.json()["inbox"]["id"], "status": "queued"}
    assert InboxItem.objects.filter(tenant=tenant).count() == count
    # Another thread is not busy; and a retry of the waiting message is its own answer, not a refusal.
    assert post_json(api, _thread(tenant, "t2") + "/messages", {"content": "x", "policy": "reject"}).status_code == 202
    _put(api, _thread(tenant), {"policy": "reject"})
    retried = post_json(api, url, {"content": "first"}, **{"Idempotency-Key": "w-1"})
    assert retried.status_code == 202 and retried.json()["inbox"]["id"] == waiting.json()["inbox"]["id"]
    before = (InboxItem.objects.filter(tenant=tenant).count(),
              AuditLog.objects.filter(tenant=tenant, action="conversation.message_send").count())
    assert post_json(api, url, {"content": "first"}).status_code == 409  # a new message (no key): refused
    # The thread's policy is read by the insert (issue 39): `reject` undid that insert and its audit row.
    assert (InboxItem.objects.filter(tenant=tenant).count(),
            AuditLog.objects.filter(tenant=tenant, action="conversation.message_send").count()) == before
