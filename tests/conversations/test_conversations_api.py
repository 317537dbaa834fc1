"""The conversation API against a protocol stub of the instance (tests/instance_stub.py): signing, the durable
inbox (idempotency, delivery while the instance is down, exactly once), the reply stream, tasks, effects,
logs and bad input. The same flows against a real agent-host are in test_conversations_e2e.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest

from conversations.choices import InboxStatus
from conversations.models import InboxItem
from conversations.tasks import inbox_deliver_pending
from instances import signing
from instances.client import forget_tenant
from provisioning.models import ProvisionedResource
from tenants.models import AuditLog
from tests.conversation_helpers import post_json, sse_events, stub_tenant
from tests.instance_stub import verify
from tests.vault.test_vault_helpers import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(operator):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(operator)
    yield tenant, stub
    stub.stop()


def _messages(tenant) -> str:  # type: ignore[no-untyped-def]
    return f"/api/v1/tenants/{tenant.pk}/threads/support-1/messages"


# --- signing: the documented scheme, checked step by step


def test_signing_vectors_follow_the_document():
    token, tenant, body = "tok-0123456789", "11111111-2222-3333-4444-555555555555", b'{"id":"x","content":"hi"}'
    key = hmac.new(token.encode(), b"agent-runtime instance-api v1", hashlib.sha256).digest()
    assert signing.signing_key(token) == key
    canonical = ("v1\nPOST\n/v1/threads/t/messages?a=1\n" + tenant + "\n1700000060\n"
                 + hashlib.sha256(body).hexdigest()).encode()
    assert signing.canonical_string("post", "/v1/threads/t/messages?a=1", tenant, 1700000060, body) == canonical
    expected = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    header = signing.sign(token, tenant, "POST", "/v1/threads/t/messages?a=1", body, now=1700000000)
    assert header == f"CP-HMAC-SHA256 tenant={tenant}, expires=1700000060, signature={expected}"
    # The derived key signs the same as the token, and an empty body hashes as the empty string.
    assert signing.sign(key, tenant, "GET", "/v1/logs", now=1700000000) == signing.sign(
        token, tenant, "GET", "/v1/logs", b"", now=1700000000)
    # An independent verifier accepts it, and refuses any other path, body, tenant, token or time.
    now = 1700000000
    assert verify(token, tenant, header, "POST", "/v1/threads/t/messages?a=1", body, now)
    assert not verify(token, tenant, header, "POST", "/v1/threads/t/messages?a=2", body, now)
    assert not verify(token, tenant, header, "POST", "/v1/threads/t/messages?a=1", body + b" ", now)
    assert not verify(token, tenant, header, "GET", "/v1/threads/t/messages?a=1", body, now)
    assert not verify("other-token", tenant, header, "POST", "/v1/threads/t/messages?a=1", body, now)
    assert not verify(token, tenant.replace("1", "9"), header, "POST", "/v1/threads/t/messages?a=1", body, now)
    assert not verify(token, tenant, header, "POST", "/v1/threads/t/messages?a=1", body, now + 61)


# --- messages and the reply stream


def test_message_round_trip_with_the_reply_stream(api, chat):
    tenant, stub = chat
    resp = post_json(api, _messages(tenant), {"content": "hello there agent"})
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["inbox"]["status"] == "delivered"
    assert body["message"]["content"] == "hello there agent" and body["task"]["id"] == body["inbox"]["id"]
    assert body["reply_url"].endswith(f"/messages/{body['inbox']['id']}/reply")
    stream = api.get(body["reply_url"], HTTP_ACCEPT="text/event-stream")
    assert stream.status_code == 200
    assert stream["Content-Type"] == "text/event-stream"
    assert stream["Cache-Control"] == "no-cache" and stream["X-Accel-Buffering"] == "no"
    events = sse_events(b"".join(stream.streaming_content))
    kinds = [e for e, _ in events]
    assert kinds == ["delta", "delta", "delta", "reply", "end"], events
    assert json.loads(events[3][1])["content"] == "echo: hello there agent"
    thread = api.get(_messages(tenant)).json()
    assert [(m["role"], m["content"]) for m in thread["messages"]] == [
        ("user", "hello there agent"), ("assistant", "echo: hello there agent")]
    # The send was audited (no content in the audit row).
    row = AuditLog.objects.get(action="conversation.message_send", tenant=tenant)
    assert row.data["thread"] == "support-1" and "hello" not in json.dumps(row.data)


def test_same_idempotency_key_twice_is_one_message(api, chat):
    tenant, stub = chat
    first = post_json(api, _messages(tenant), {"content": "pay invoice 42"}, **{"Idempotency-Key": "k-1"})
    again = post_json(api, _messages(tenant), {"content": "pay invoice 42"}, **{"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["inbox"]["id"] == again.json()["inbox"]["id"]
    assert len(stub.user_messages("support-1")) == 1
    assert InboxItem.objects.filter(tenant=tenant).count() == 1
    other = post_json(api, _messages(tenant), {"content": "pay invoice 43"}, **{"Idempotency-Key": "k-1"})
    assert_problem(other, 422)
    assert len(stub.user_messages("support-1")) == 1


def test_message_while_the_instance_is_down_is_accepted_then_answered_exactly_once(api, chat, settings):
    tenant, stub = chat
    stub.down = True
    resp = post_json(api, _messages(tenant), {"content": "are you there?"}, **{"Idempotency-Key": "down-1"})
    assert resp.status_code == 202, resp.content
    item_id = resp.json()["inbox"]["id"]
    assert resp.json()["inbox"]["status"] == "pending"
    assert stub.user_messages("support-1") == []
    item = InboxItem.objects.get(pk=item_id)
    assert item.status == InboxStatus.PENDING and item.attempts == 1 and item.last_error
    # Reads need the instance: 503 with Retry-After, problem+json.
    down = api.get(_messages(tenant))
    assert_problem(down, 503)
    assert down["Retry-After"] == "1"
    # A retry with the same key while it is down is the same pending item.
    again = post_json(api, _messages(tenant), {"content": "are you there?"}, **{"Idempotency-Key": "down-1"})
    assert again.status_code == 202 and again.json()["inbox"]["id"] == item_id
    stub.down = False
    assert inbox_deliver_pending() == 1  # beat's job
    assert inbox_deliver_pending() == 0
    item.refresh_from_db()
    assert item.status == InboxStatus.DELIVERED
    assert [m["message_id"] for m in stub.user_messages("support-1")] == [item_id]
    assert stub.posts.count(("/v1/threads/support-1/messages", item_id)) == 1
    replay = post_json(api, _messages(tenant), {"content": "are you there?"}, **{"Idempotency-Key": "down-1"})
    assert replay.status_code == 200 and replay.json()["message"]["message_id"] == item_id
    assert len(stub.user_messages("support-1")) == 1


def test_pending_items_are_delivered_in_order_and_stop_at_the_first_unavailable(api, chat):
    tenant, stub = chat
    stub.down = True
    ids = [post_json(api, _messages(tenant), {"content": f"m{i}"}).json()["inbox"]["id"] for i in range(3)]
    assert InboxItem.objects.get(pk=ids[0]).attempts >= 1
    stub.down = False
    from conversations.services import inbox_deliver

    assert inbox_deliver(tenant=tenant) == 3
    assert [m["message_id"] for m in stub.user_messages("support-1")] == ids


def test_a_stopped_instance_is_503_for_reads_and_202_for_writes(api, chat):
    tenant, stub = chat
    stub.stop()
    assert post_json(api, _messages(tenant), {"content": "hi"}).status_code == 202
    for path in (_messages(tenant), f"/api/v1/tenants/{tenant.pk}/tasks", f"/api/v1/tenants/{tenant.pk}/logs",
                 f"/api/v1/tenants/{tenant.pk}/effects"):
        problem = assert_problem(api.get(path), 503)
        assert problem["code"] == "instance_unavailable"
    assert post_json(api, f"/api/v1/tenants/{tenant.pk}/tasks", {"kind": "demo"}).status_code == 202


@pytest.mark.parametrize(("status", "code"), [("suspended", "tenant_suspended"), ("provisioning", "instance_not_ready"),
                                            ("pending", "instance_not_ready"), ("failed", "instance_not_ready")])
def test_reads_of_a_tenant_whose_instance_is_not_meant_to_run_are_409_naming_why(api, chat, status, code):
    """Nothing is down, so not a 503: the tenant's own state answers, and writes still wait in the inbox."""
    tenant, stub = chat
    type(tenant).objects.filter(pk=tenant.pk).update(status=status)
    for path in (_messages(tenant), f"/api/v1/tenants/{tenant.pk}/tasks", f"/api/v1/tenants/{tenant.pk}/logs",
                 f"/api/v1/tenants/{tenant.pk}/effects"):
        problem = assert_problem(api.get(path), 409)
        assert problem["code"] == code and problem["type"] == "/problems/" + code.replace("_", "-")
    sent = post_json(api, _messages(tenant), {"content": "hi"})
    assert sent.status_code == 202 and sent.json()["inbox"]["status"] == "pending"
    assert stub.posts == []  # held in the inbox, not delivered to an instance that is not meant to run


@pytest.mark.parametrize("status", ["deprovisioning", "deleted"])
def test_conversations_of_a_tenant_being_deleted_are_404(api, chat, status):
    tenant, _stub = chat
    type(tenant).objects.filter(pk=tenant.pk).update(status=status)
    assert_problem(api.get(_messages(tenant)), 404)
    assert_problem(post_json(api, _messages(tenant), {"content": "hi"}), 404)
    assert not InboxItem.objects.filter(tenant=tenant).exists()


def test_nul_in_task_params_or_an_effect_result_is_400_and_nothing_is_queued(api, chat):
    tenant, _stub = chat
    base = f"/api/v1/tenants/{tenant.pk}"
    for path, body in ((f"{base}/tasks", {"kind": "demo", "params": {"a": ["x\u0000"]}}),
                       (f"{base}/tasks", {"kind": "demo", "params": {"k\u0000": 1}}),
                       (f"{base}/effects/e-1/decision", {"decision": "performed", "result": {"n": {"m": "\u0000"}}})):
        problem = assert_problem(post_json(api, path, body), 400)
        assert "NUL" in problem["detail"]
    assert not InboxItem.objects.filter(tenant=tenant).exists()


def test_reply_stream_waits_while_queued_then_times_out(api, chat, monkeypatch):
    from conversations.api import views

    tenant, stub = chat
    stub.down = True
    item_id = post_json(api, _messages(tenant), {"content": "hello"}).json()["inbox"]["id"]
    monkeypatch.setattr(views, "REPLY_WAIT_S", 1.5)
    stream = api.get(f"{_messages(tenant)}/{item_id}/reply", HTTP_ACCEPT="text/event-stream")
    events = sse_events(b"".join(stream.streaming_content))
    assert events[0][0] == "queued" and ("comment", "keep-alive") in events and events[-1][0] == "timeout"
    # Once the instance is back the stream delivers the message itself and relays the reply.
    stub.down = False
    stream = api.get(f"{_messages(tenant)}/{item_id}/reply", HTTP_ACCEPT="text/event-stream")
    kinds = [e for e, _ in sse_events(b"".join(stream.streaming_content))]
    assert kinds[-2:] == ["reply", "end"]
    assert len(stub.user_messages("support-1")) == 1


def test_reply_stream_broken_off_by_the_instance_ends_with_interrupted(api, chat):
    tenant, stub = chat
    url = post_json(api, _messages(tenant), {"content": "a b c d"}).json()["reply_url"]
    stub.drop_reply_after = 1
    events = sse_events(b"".join(api.get(url, HTTP_ACCEPT="text/event-stream").streaming_content))
    assert [e for e, _ in events] == ["delta", "interrupted"]
    stub.drop_reply_after = None
    events = sse_events(b"".join(api.get(url, HTTP_ACCEPT="text/event-stream").streaming_content))
    assert events[-1][0] == "end"


def test_reply_of_an_unknown_or_foreign_message_is_404(api, chat, operator):
    tenant, stub = chat
    other, other_stub = stub_tenant(operator)
    try:
        foreign = post_json(api, f"/api/v1/tenants/{other.pk}/threads/support-1/messages", {"content": "x"})
        fid = foreign.json()["inbox"]["id"]
        assert_problem(api.get(f"{_messages(tenant)}/{fid}/reply"), 404)
        assert_problem(api.get(f"{_messages(tenant)}/not-a-uuid/reply"), 404)
    finally:
        other_stub.stop()


# --- bad input


@pytest.mark.parametrize("body", [
    {"content": "x" * 32_001},  # oversized
    {"content": ""},
    {"content": "   "},
    {"content": "nul\x00byte"},
    {"content": 42},
    {"content": "hi", "role": "system"},  # unknown field
    ["content"],
    {},
])
def test_bad_messages_are_400_and_nothing_is_queued(api, chat, body):
    tenant, stub = chat
    assert_problem(post_json(api, _messages(tenant), body), 400)
    assert not InboxItem.objects.filter(tenant=tenant).exists()


def test_invalid_utf8_and_not_json_are_400(api, chat):
    tenant, stub = chat
    for raw in (b'{"content": "\xff\xfe"}', b"{not json"):
        assert_problem(api.post(_messages(tenant), data=raw, content_type="application/json"), 400)
    assert not InboxItem.objects.filter(tenant=tenant).exists()


def test_a_message_at_the_limit_is_accepted(api, chat):
    tenant, stub = chat
    assert post_json(api, _messages(tenant), {"content": "é" * 32_000}).status_code == 201


@pytest.mark.parametrize("thread", ["a/b", "x" * 201, "sp ace", "%00"])
def test_bad_thread_names_are_refused(api, chat, thread):
    tenant, stub = chat
    resp = post_json(api, f"/api/v1/tenants/{tenant.pk}/threads/{thread}/messages", {"content": "hi"})
    assert resp.status_code in (400, 404), resp.content


def test_unknown_thread_is_404(api, chat):
    tenant, stub = chat
    problem = assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/threads/never-used/messages"), 404)
    assert problem["code"] == "not_found"


def test_an_instance_refusal_is_stored_and_returned(api, operator):
    tenant, stub = stub_tenant(operator, kinds=())
    try:
        problem = assert_problem(post_json(api, _messages(tenant), {"content": "hi"}), 409)
        assert problem["code"] == "conversations_unsupported"
        item = InboxItem.objects.get(tenant=tenant)
        assert item.status == InboxStatus.REFUSED and item.response["code"] == "conversations_unsupported"
    finally:
        stub.stop()


# --- tasks, effects, logs


def test_tasks_submit_list_detail_cancel(api, chat):
    tenant, stub = chat
    base = f"/api/v1/tenants/{tenant.pk}/tasks"
    created = post_json(api, base, {"kind": "demo", "params": {"n": 1}}, **{"Idempotency-Key": "t-1"})
    assert created.status_code == 201, created.content
    task_id = created.json()["task"]["id"]
    assert created.json()["inbox"]["id"] == task_id
    assert post_json(api, base, {"kind": "demo", "params": {"n": 1}}, **{"Idempotency-Key": "t-1"}).status_code == 200
    assert_problem(post_json(api, base, {"kind": "demo", "params": {"n": 2}}, **{"Idempotency-Key": "t-1"}), 422)
    assert [t["id"] for t in api.get(base).json()["tasks"]] == [task_id]
    assert api.get(f"{base}/{task_id}").json()["task"]["kind"] == "demo"
    assert_problem(api.get(f"{base}/not-a-uuid"), 404)
    cancelled = api.post(f"{base}/{task_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["task"]["status"] == "cancelled"
    problem = assert_problem(api.post(f"{base}/{task_id}/cancel"), 409)
    assert problem["code"] == "conflict"
    assert_problem(post_json(api, f"{base}/{task_id}/cancel", {"why": "no"}), 400)
    problem = assert_problem(post_json(api, base, {"kind": "not-installed"}), 409)
    assert problem["code"] == "unknown_kind"
    assert_problem(post_json(api, base, {"kind": "demo", "params": [1]}), 400)
    assert_problem(api.get(f"{base}?status=bogus"), 400)


def test_deciding_an_effect_of_a_cancelled_task_is_409_and_an_open_one_is_audited(api, chat):
    tenant, stub = chat
    base = f"/api/v1/tenants/{tenant.pk}"
    task_id = post_json(api, f"{base}/tasks", {"kind": "demo"}).json()["task"]["id"]
    key = stub.add_effect(task_id)
    listed = api.get(f"{base}/effects").json()["effects"]
    assert [e["key"] for e in listed] == [key]
    assert api.post(f"{base}/tasks/{task_id}/cancel").status_code == 200
    problem = assert_problem(post_json(api, f"{base}/effects/{key}/decision", {"decision": "performed"}), 409)
    assert problem["code"] == "conflict"
    live_task = post_json(api, f"{base}/tasks", {"kind": "demo"}).json()["task"]["id"]
    live = stub.add_effect(live_task)
    decided = post_json(api, f"{base}/effects/{live}/decision",
                        {"decision": "performed", "result": {"charge": "ch_1"}, "note": "checked the dashboard"})
    assert decided.status_code == 200, decided.content
    assert decided.json()["effect"]["state"] == "committed"
    assert "checked the dashboard" in decided.json()["effect"]["resolution"]["decided_by"]
    row = AuditLog.objects.get(action="effect.decide", tenant=tenant, data__effect=live)
    assert row.data["decision"] == "performed"
    assert_problem(post_json(api, f"{base}/effects/{live}/decision", {"decision": "maybe"}), 400)
    assert_problem(post_json(api, f"{base}/effects/eff-unknown/decision", {"decision": "performed"}), 404)
    # The longest note the API takes reaches the instance cut to its 200 characters, whole in the inbox.
    third = stub.add_effect(post_json(api, f"{base}/tasks", {"kind": "demo"}).json()["task"]["id"])
    long_note = "n" * 2000
    decided = post_json(api, f"{base}/effects/{third}/decision", {"decision": "not_performed", "note": long_note})
    assert decided.status_code == 200, decided.content
    assert len(decided.json()["effect"]["resolution"]["decided_by"]) == 200
    assert InboxItem.objects.get(tenant=tenant, payload__effect=third).payload["note"] == long_note


def test_logs(api, chat):
    tenant, stub = chat
    assert api.get(f"/api/v1/tenants/{tenant.pk}/logs?limit=5").json()["records"][0]["msg"] == "hello from the stub"
    assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/logs?limit=0"), 400)
    assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/logs?level=loud"), 400)


# --- where the instance is, scopes, the heartbeat hook


def test_the_local_driver_port_file_is_read_on_every_call_and_must_be_the_hosts_own(api, chat, tmp_path, caplog):
    """The stub listens in this process, which is not the tenant's host: a pid file naming it (as a tenant's
    rewrite would name the control plane's own process) is refused even though that process does listen on the
    port. A real host's port believed, and refused when rewritten: ``test_isolation_published_port.py``."""
    from provisioning.drivers.local_process import published_port

    tenant, stub = chat
    ProvisionedResource.objects.create(tenant=tenant, kind="volume", driver="local-volume",
                                       details={"path": str(tmp_path)})
    ProvisionedResource.objects.create(tenant=tenant, kind="runtime", driver="local-process", details={})
    forget_tenant(str(tenant.pk))
    assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/logs"), 503)  # no port published
    (tmp_path / ".host").mkdir()
    Path(tmp_path / ".host" / "instance.pid").write_text(str(os.getpid()))
    for port in (5432, stub.port):  # PostgreSQL's port, then one this very process listens on
        Path(tmp_path / ".host" / "http-port").write_text(str(port))
        with caplog.at_level("WARNING", logger="provisioning.drivers.local_process"):
            assert_problem(api.get(f"/api/v1/tenants/{tenant.pk}/logs"), 503)
        assert published_port(tmp_path / ".host", str(tenant.pk)) is None
    # Logged at every refusal (the API's call, then ours), audited once per attempt.
    assert [r.port for r in caplog.records if getattr(r, "event", "") == "instance_port_refused"] == [
        5432, 5432, stub.port, stub.port]
    audited = AuditLog.objects.filter(action="security.cross_tenant_attempt", tenant=tenant,
                                      data__resource="instance-port")
    assert sorted(row.data["port"] for row in audited) == sorted([5432, stub.port])


def test_operator_scopes_are_enforced_and_other_operators_see_404(operator, make_token, chat):
    from rest_framework.test import APIClient

    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    tenant, stub = chat
    read_only = APIClient()
    read_only.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator, ['conversations:read'])}")
    assert_problem(post_json(read_only, _messages(tenant), {"content": "hi"}), 403)
    assert_problem(read_only.get(f"/api/v1/tenants/{tenant.pk}/logs"), 403)
    other = APIClient()
    other_op = operator_create(slug="op-other-conv", name="Other", actor=SYSTEM)
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(other_op)}")
    assert_problem(other.get(_messages(tenant)), 404)
    assert_problem(post_json(other, _messages(tenant), {"content": "hi"}), 404)
    assert not InboxItem.objects.filter(tenant=tenant).exists()


def test_a_ready_heartbeat_queues_delivery_of_pending_items(api, chat, monkeypatch,
                                                            django_capture_on_commit_callbacks):
    from conversations import tasks
    from provisioning.models import AgentInstance
    from tests.vault.test_vault_helpers import bearer_client, make_instance

    tenant, stub = chat
    stub.down = True
    post_json(api, _messages(tenant), {"content": "while asleep"})
    queued: list[str] = []
    monkeypatch.setattr(tasks.inbox_deliver_tenant, "delay", lambda tid: queued.append(tid))
    token = make_instance(tenant)
    AgentInstance.objects.filter(tenant=tenant).update(endpoint=stub.url)
    instance = bearer_client(token)
    with django_capture_on_commit_callbacks(execute=True):
        assert post_json(instance, "/internal/v1/heartbeat", {"status": "booting"}).status_code == 204
    assert queued == []
    with django_capture_on_commit_callbacks(execute=True):
        assert post_json(instance, "/internal/v1/heartbeat", {"status": "idle"}).status_code == 204
    assert queued == [str(tenant.pk)]
    stub.down = False
    assert tasks.inbox_deliver_tenant(queued[0]) == 1
