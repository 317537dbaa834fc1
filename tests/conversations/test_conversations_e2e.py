"""Talking to a real agent-host through the control plane: onboarded by a real Celery worker, running the
conversational test agent (``chat`` in tests/runtime/agents.py), its thread counted in the tenant's schema.

Covers the round trip with the streamed reply (and the task's record on the staff log screen), one message
per Idempotency-Key, a message sent while the instance is stopped (202, then answered exactly once after it
starts), a SIGKILL mid-reply (the stream ends ``interrupted``; after the restart the reply arrives once), and
calls straight to the instance's port without the control plane's signature or with another tenant's valid
one (401).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from psycopg import sql
from rest_framework.test import APIClient

from conversations.choices import InboxStatus
from conversations.models import InboxItem
from conversations.services import inbox_deliver
from instances.client import forget_tenant
from instances.signing import sign
from provisioning.drivers.local_process import live_host_pid
from provisioning.drivers.pg_admin import admin_connect
from provisioning.fleet.instances import instance_start
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import kill_session_instances, wait_for
from tests.conversation_helpers import CHAT_HOLD_NAME, chat_hold, chat_release, post_json, sse_events

pytestmark = pytest.mark.django_db(transaction=True)

# No commas or '=' in the JSON: INSTANCE_EXTRA_ENV is a k=v,k=v list.
EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_CONFIG": json.dumps({"chat_hold_file": CHAT_HOLD_NAME})}


@pytest.fixture
def fleet(worker_factory, settings):  # type: ignore[no-untyped-def]
    settings.INSTANCE_EXTRA_ENV = dict(EXTRA_ENV)  # this process restarts instances too (instance_start)
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in EXTRA_ENV.items()))
    chat_release()
    yield worker
    chat_release()
    kill_session_instances()  # this test's tenants are flushed from the database: their instances must go too


def _onboard(operator, slug: str, worker) -> Tenant:  # type: ignore[no-untyped-def]
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug, actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", (tenant.status_reason, worker.log()[-2000:])
    forget_tenant(str(tenant.pk))
    return tenant


def _thread_rows(tenant: Tenant, thread: str) -> list[tuple[str, str, dict]]:
    with admin_connect(autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT role, content, metadata FROM {}.messages WHERE thread = %s ORDER BY seq")
                            .format(sql.Identifier(tenant.resource_name)), (thread,)).fetchall()


def _port(tenant: Tenant) -> int:
    volume = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name
    return int((volume / ".host" / "http-port").read_text())


def _raw_call(port: int, method: str, path: str, body: bytes = b"", auth: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    conn.request(method, path, body=body or None, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def _stop(tenant: Tenant) -> None:
    """SIGTERM and wait until it is gone (it is the worker's child: a zombie until reaped, which counts as gone)."""
    spec = tenant_spec(tenant)
    os.kill(live_host_pid(spec), signal.SIGTERM)
    wait_for(lambda: live_host_pid(spec) is None, timeout=30, what="instance stopped")


def _messages(tenant: Tenant, thread: str = "web") -> str:
    return f"/api/v1/tenants/{tenant.pk}/threads/{thread}/messages"


def _stream(api: APIClient, url: str) -> list[tuple[str, str]]:
    resp = api.get(url, HTTP_ACCEPT="text/event-stream")
    assert resp.status_code == 200, resp.content
    return sse_events(b"".join(resp.streaming_content))


def test_round_trip_idempotency_and_the_instance_port_refuses_unsigned_or_foreign_calls(api, fleet):
    tenant = _onboard(api.operator, "chat-a", fleet)
    other = _onboard(api.operator, "chat-b", fleet)

    chat_hold()  # the agent streams its first word and waits: the stream sees the deltas
    sent = post_json(api, _messages(tenant), {"content": "hello agent"}, **{"Idempotency-Key": "m-1"})
    assert sent.status_code == 201, sent.content
    body = sent.json()
    message_id = body["inbox"]["id"]
    assert body["message"]["message_id"] == message_id and body["task"]["id"] == message_id
    release = threading.Timer(1.0, chat_release)
    release.start()
    events = _stream(api, body["reply_url"])
    release.join()
    kinds = [e for e, _ in events]
    assert "delta" in kinds and kinds[-2:] == ["reply", "end"], events
    assert json.loads(events[-2][1])["content"] == "echo: hello agent"
    deltas = "".join(json.loads(d)["text"] for e, d in events if e == "delta")
    assert deltas == "echo: hello agent"
    thread = api.get(_messages(tenant)).json()
    assert [(m["role"], m["content"]) for m in thread["messages"]] == [("user", "hello agent"),
                                                                        ("assistant", "echo: hello agent")]
    # The same key again: the same message, nothing new in the tenant's schema.
    again = post_json(api, _messages(tenant), {"content": "hello agent"}, **{"Idempotency-Key": "m-1"})
    assert again.status_code == 200 and again.json()["inbox"]["id"] == message_id
    assert [r[0] for r in _thread_rows(tenant, "web")] == ["user", "assistant"]
    assert InboxItem.objects.filter(tenant=tenant).count() == 1

    # Bad input and unknown things, through the control plane.
    assert post_json(api, _messages(tenant), {"content": "x" * 32_001}).status_code == 400
    assert api.post(_messages(tenant), data=b'{"content": "\xff"}', content_type="application/json").status_code == 400
    assert api.get(_messages(tenant, "never-used")).status_code == 404
    assert api.get(f"/api/v1/tenants/{tenant.pk}/logs?limit=20").status_code == 200
    tasks = api.get(f"/api/v1/tenants/{tenant.pk}/tasks").json()["tasks"]
    assert [t["id"] for t in tasks] == [message_id] and tasks[0]["status"] == "done"
    detail = api.get(f"/api/v1/tenants/{tenant.pk}/tasks/{message_id}").json()
    assert detail["task"]["kind"] == "chat"
    assert api.post(f"/api/v1/tenants/{tenant.pk}/tasks/{message_id}/cancel").status_code == 409  # already done
    # The staff log screen reads the real host's log: its "task outcome" record is found by the task's id and
    # links to the task's page.
    staff = Client()
    staff.force_login(User.objects.create_user("log-reader", is_staff=True))
    logs_url = f"/dashboard/tenants/{tenant.pk}/logs/?q={message_id}"
    task_link = f'href="/dashboard/tenants/{tenant.pk}/tasks/{message_id}/"'
    wait_for(lambda: task_link in staff.get(logs_url).content.decode(), timeout=15, what="the task's log record")
    assert "task outcome" in staff.get(logs_url).content.decode()

    # Straight to the instance's port: no signature, B's valid signature, a replayed signature on another path.
    port = _port(tenant)
    path = "/v1/threads/web/messages"
    payload = json.dumps({"id": "6f1c9a62-0000-4000-8000-000000000001", "content": "sneaky"}).encode()
    assert _raw_call(port, "GET", path) == 401
    assert _raw_call(port, "POST", path, payload) == 401
    b_token = tenant_spec(other, with_secrets=("instance_token",)).secrets["instance_token"]
    assert _raw_call(port, "POST", path, payload, sign(b_token, str(other.pk), "POST", path, payload)) == 401
    assert _raw_call(port, "POST", path, payload, sign(b_token, str(tenant.pk), "POST", path, payload)) == 401
    a_token = tenant_spec(tenant, with_secrets=("instance_token",)).secrets["instance_token"]
    get_sig = sign(a_token, str(tenant.pk), "GET", path)
    assert _raw_call(port, "GET", path, auth=get_sig) == 200  # the control plane's own signature works
    assert _raw_call(port, "GET", "/v1/logs", auth=get_sig) == 401  # bound to its path
    assert _raw_call(port, "POST", path, payload, get_sig) == 401  # and to its method and body
    assert [r[1] for r in _thread_rows(tenant, "web") if r[0] == "user"] == ["hello agent"]
    # B's instance answers B only.
    for_b = post_json(api, _messages(other), {"content": "for b"})
    assert for_b.status_code == 201
    assert _stream(api, for_b.json()["reply_url"])[-1][0] == "end"
    assert [r[1] for r in _thread_rows(other, "web")] == ["for b", "echo: for b"]


def test_a_message_sent_while_the_instance_is_stopped_is_answered_exactly_once_after_it_starts(api, fleet):
    tenant = _onboard(api.operator, "chat-sleep", fleet)
    _stop(tenant)
    sent = post_json(api, _messages(tenant), {"content": "are you awake"}, **{"Idempotency-Key": "sleep-1"})
    assert sent.status_code == 202, sent.content
    item_id = sent.json()["inbox"]["id"]
    again = post_json(api, _messages(tenant), {"content": "are you awake"}, **{"Idempotency-Key": "sleep-1"})
    assert again.status_code == 202 and again.json()["inbox"]["id"] == item_id
    down = api.get(_messages(tenant))
    assert down.status_code == 503 and down["Retry-After"] == "1"
    instance_start(tenant=tenant, actor=SYSTEM)
    # Delivered by whoever gets there first (this call, beat, a heartbeat); twice would be harmless.
    inbox_deliver(tenant=tenant)
    inbox_deliver(tenant=tenant)
    assert InboxItem.objects.get(pk=item_id).status == InboxStatus.DELIVERED
    events = _stream(api, f"{_messages(tenant)}/{item_id}/reply")
    assert events[-1][0] == "end", events
    rows = _thread_rows(tenant, "web")
    assert [(r[0], r[1]) for r in rows] == [("user", "are you awake"), ("assistant", "echo: are you awake")]
    assert rows[0][2]["message_id"] == item_id and rows[1][2]["task"] == item_id


def test_sigkill_mid_reply_interrupts_the_stream_and_the_reply_arrives_once_after_restart(api, fleet):
    tenant = _onboard(api.operator, "chat-kill", fleet)
    chat_hold()  # the agent streams its first word, then waits
    sent = post_json(api, _messages(tenant), {"content": "survive this"})
    assert sent.status_code == 201, sent.content
    url = sent.json()["reply_url"]
    pid = live_host_pid(tenant_spec(tenant))

    def kill_soon() -> None:
        wait_for(lambda: _thread_rows(tenant, "web"), timeout=20, what="question stored")
        os.kill(pid, signal.SIGKILL)

    killer = threading.Timer(1.0, kill_soon)
    killer.start()
    events = _stream(api, url)
    killer.join()
    kinds = [e for e, _ in events]
    assert kinds[-1] == "interrupted", events
    assert "reply" not in kinds
    chat_release()
    instance_start(tenant=tenant, actor=SYSTEM)
    events = _stream(api, url)
    assert [e for e, _ in events][-2:] == ["reply", "end"], events
    rows = _thread_rows(tenant, "web")
    assert [(r[0], r[1]) for r in rows] == [("user", "survive this"), ("assistant", "echo: survive this")]


def _blocked_email(tenant: Tenant) -> tuple[str, str]:
    """A 'multi' task whose email is blocked for a human, written as the runtime's ledger leaves it (with the
    instance stopped: the runtime's tables accept one writer at a time)."""
    from provisioning.drivers.local_process import instance_environment
    from tests.runtime.blocked_effects import plant_blocked_email

    return plant_blocked_email(instance_environment(tenant_spec(tenant, with_secrets=("db_password",
                                                                                     "object_key_b64"))))


def test_deciding_an_effect_of_a_cancelled_task_is_409_and_an_open_one_is_decided(api, fleet):
    tenant = _onboard(api.operator, "chat-effects", fleet)
    _stop(tenant)
    cancelled_task, cancelled_key = _blocked_email(tenant)
    open_task, open_key = _blocked_email(tenant)
    instance_start(tenant=tenant, actor=SYSTEM)
    base = f"/api/v1/tenants/{tenant.pk}"
    listed = api.get(f"{base}/effects").json()["effects"]
    assert {(e["key"], e["state"]) for e in listed} == {(cancelled_key, "blocked"), (open_key, "blocked")}
    assert api.post(f"{base}/tasks/{cancelled_task}/cancel").status_code == 200
    refused = post_json(api, f"{base}/effects/{cancelled_key}/decision", {"decision": "perform_now"})
    assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.content
    decided = post_json(api, f"{base}/effects/{open_key}/decision",
                        {"decision": "not_performed", "note": "the relay never got it"})
    assert decided.status_code == 200, decided.content
    effect = decided.json()["effect"]
    assert effect["state"] == "failed"
    # The decision re-queues the task (one transaction): its step replays, meets the failed effect and blocks
    # the task. Until the worker has run it, the task is pending or running.
    wait_for(lambda: api.get(f"{base}/tasks/{open_task}").json()["task"]["status"] not in ("pending", "running"),
             timeout=30, what="the decided task settled")
    assert api.get(f"{base}/tasks/{open_task}").json()["task"]["status"] == "blocked"
    # Settled now: a second decision is refused too.
    assert post_json(api, f"{base}/effects/{open_key}/decision", {"decision": "performed"}).status_code == 409


def test_a_settle_lost_to_a_crash_is_redelivered_and_the_instance_keeps_one_message(api, fleet):
    """The settle after the call commits with ``synchronous_commit`` off (``conversations.services._settle``): a
    database crash can lose it and leave the item pending, as here. The redelivery must find the message the
    instance already has (de-duplicated by the item's id), not write a second one or run its task again: this
    fails if that de-duplication breaks."""
    tenant = _onboard(api.operator, "chat-lost-settle", fleet)
    sent = post_json(api, _messages(tenant), {"content": "only once", "policy": "interrupt"})
    assert sent.status_code == 201, sent.content
    item_id = sent.json()["inbox"]["id"]
    first_task = sent.json()["task"]
    InboxItem.objects.filter(pk=item_id).update(status=InboxStatus.PENDING, delivered_at=None, response=None,
                                                response_status=None)  # what the lost commit leaves
    assert inbox_deliver(tenant=tenant) == 1
    item = InboxItem.objects.get(pk=item_id)
    assert item.status == InboxStatus.DELIVERED and item.response_status == 200, item.response  # 200: it had it
    assert item.response["task"]["id"] == first_task["id"] == item_id
    events = _stream(api, f"{_messages(tenant)}/{item_id}/reply")
    assert events[-1][0] == "end", events
    rows = _thread_rows(tenant, "web")
    assert [(r[0], r[1]) for r in rows] == [("user", "only once"), ("assistant", "echo: only once")]


def test_the_settle_waits_for_the_answer_and_a_message_that_overtakes_it_is_kept_once(api, fleet):
    """Issue 39: a message's settle runs once its answer has been sent (``controlplane.after_response``), through
    Django's own WSGI handler as gunicorn drives it: the body is read, then the response closed. Here the tenant's
    next message arrives between the two, finds the first item still pending, and delivers it again before itself
    (the order kept); the instance must answer that redelivery from what it has (200) and keep one of each message,
    and the late settle must not overwrite the redelivery's record. Fails if the settle runs before the answer, or
    if an overtaken settle is delivered twice."""
    tenant = _onboard(api.operator, "chat-late-settle", fleet)
    body = json.dumps({"content": "first"}).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": _messages(tenant), "QUERY_STRING": "", "SCRIPT_NAME": "",
               "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
               "HTTP_AUTHORIZATION": api._credentials["HTTP_AUTHORIZATION"], "wsgi.input": io.BytesIO(body),
               "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http", "wsgi.version": (1, 0),
               "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False}
    started: list[str] = []
    # As Django's test client does: this test's database connection is not closed between requests.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        respiter = WSGIHandler()(environ, lambda status, headers, exc_info=None: started.append(status))
        answer = json.loads(b"".join(respiter))  # the server has sent the whole answer; not closed yet
        assert started == ["201 Created"], started
        first_id = answer["inbox"]["id"]
        assert answer["inbox"]["status"] == "delivered" and answer["task"]["id"] == first_id
        assert InboxItem.objects.get(pk=first_id).status == InboxStatus.PENDING, "settled before the answer left"

        second = post_json(api, _messages(tenant), {"content": "second"})
        assert second.status_code == 201, second.content
        assert second.json()["inbox"]["status"] == "delivered"
        first = InboxItem.objects.get(pk=first_id)
        assert first.status == InboxStatus.DELIVERED and first.response_status == 200, first.response  # it had it
        assert first.attempts == 1, "the redelivery's record"

        respiter.close()  # the late settle: the item is no longer pending, so it changes nothing
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    first = InboxItem.objects.get(pk=first_id)
    assert (first.status, first.response_status, first.attempts) == (InboxStatus.DELIVERED, 200, 1)
    wait_for(lambda: len(_thread_rows(tenant, "web")) == 4, timeout=30, what="both messages answered")
    rows = _thread_rows(tenant, "web")
    assert sorted((r[0], r[1]) for r in rows) == [("assistant", "echo: first"), ("assistant", "echo: second"),
                                                   ("user", "first"), ("user", "second")]
