"""Issue 37: webhook events for what an instance does by itself (a task done, blocked or failed; a reply
committed), each sent once, and request/response bodies in the delivery log.

The first case runs a real agent-host (a real Celery worker onboards it and delivers the webhooks) and the
example receiver (examples/webhook_receiver.py) as its own process: the events are read from the instance's
own tables by the webhooks sweep's body, and the receiver's file says what arrived. A sweep run again, or with
its cursor put back (a replayed detection), sends nothing twice. The second case is the delivery log: a real
HTTP receiver that answers a long body and headers that must not be kept.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from conversations.services import message_send, task_submit
from instances.blocked_reasons import BLOCKED_REASONS
from instances.client import forget_tenant, instance_client
from provisioning.drivers.pg_admin import tenant_admin_connect
from tenants.actors import SYSTEM
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.portal.test_webhooks_portal import _portal
from tests.webhooks.test_webhook_receiver_example import example  # noqa: F401 - the receiver process, a fixture
from webhooks.choices import DeliveryStatus
from webhooks.models import Event, RuntimeEventCursor, WebhookAttempt, WebhookDelivery
from webhooks.runtime_events import runtime_events_detect
from webhooks.services import delivery_attempt, endpoint_create, event_payload, event_record


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    extra = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_HEARTBEAT_INTERVAL_S": "1",
             "AGENT_SMTP_URL": sinks["smtp"]}
    settings.INSTANCE_EXTRA_ENV = dict(extra)
    worker = worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, WEBHOOK_ALLOW_HTTP="true",
                            WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true",
                            INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    yield worker
    kill_session_instances()


def _task_status(tenant: Any, task_id: str) -> str:
    try:
        _, body = instance_client(tenant).request_json("GET", f"/v1/tasks/{task_id}")
    except Exception:  # noqa: BLE001 - not up yet, or not there yet: asked again
        return ""
    return str((body.get("task") or body).get("status", ""))


def _received(events_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []


def _ours(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"].startswith(("task.succeeded", "task.blocked", "task.failed", "message."))]


@pytest.mark.django_db(transaction=True)
def test_a_real_instances_outcomes_and_reply_reach_a_real_receiver_once_each(fleet, example):  # noqa: F811
    operator, _created, _port, events_file = example
    tenant = onboard_ready(operator, "outcomes")
    forget_tenant(str(tenant.pk))
    done = task_submit(tenant=tenant, kind="metered", params={"n": 1}, idempotency_key=None, actor=SYSTEM).item
    # `keyed` reads the credential `openai`, which this customer's vault does not hold: blocked.
    blocked = task_submit(tenant=tenant, kind="keyed", params={}, idempotency_key=None, actor=SYSTEM).item
    message = message_send(tenant=tenant, thread="web", content="hello agent", idempotency_key=None,
                           actor=SYSTEM).item
    wait_for(lambda: (_task_status(tenant, str(done.id)), _task_status(tenant, str(blocked.id)),
                      _task_status(tenant, str(message.id))) == ("done", "blocked", "done"),
             timeout=90, what="tasks done and blocked")

    first = runtime_events_detect()
    assert first.events == 4 and first.skipped == 0, first
    wait_for(lambda: len(_ours(_received(events_file))) >= 4, timeout=60, what="four events at the receiver")
    # The sweep again, twice, then with its cursor put back an hour (a replayed detection): nothing new.
    assert runtime_events_detect().events == 0 and runtime_events_detect().events == 0
    RuntimeEventCursor.objects.filter(tenant=tenant).update(
        tasks_after=timezone.now() - timedelta(hours=1),
        replies_after=timezone.now() - timedelta(hours=1))
    assert runtime_events_detect().events == 0

    # The blocked task ends failed (as a runtime that fails tasks writes it, with the runtime's own function):
    # a new fact about the same task, so one more event.
    from agent_runtime.state.tasks import set_status

    with tenant_admin_connect(tenant, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{tenant.resource_name}"')
        set_status(conn, blocked.id, "failed")
    assert runtime_events_detect().events == 1
    wait_for(lambda: len(_ours(_received(events_file))) >= 5, timeout=60, what="the failure at the receiver")
    assert runtime_events_detect().events == 0

    received = _ours(_received(events_file))
    assert len({e["id"] for e in received}) == len(received) == 5  # each fact once, no duplicate delivery
    assert Counter(e["type"] for e in received) == {"task.succeeded": 2, "task.blocked": 1, "message.replied": 1,
                                                    "task.failed": 1}
    by_type = {e["type"]: e for e in received}
    block = by_type["task.blocked"]
    assert block["tenant"] == str(tenant.pk)
    assert block["data"]["task"] == str(blocked.id) and block["data"]["kind"] == "keyed"
    assert block["data"]["reason"] == "credential_unavailable"
    assert block["data"]["reason_text"] == BLOCKED_REASONS["credential_unavailable"].text
    assert block["data"]["action"] == BLOCKED_REASONS["credential_unavailable"].action
    assert "detail" not in block["data"] and "openai" not in json.dumps(block)  # the runtime's detail stays in
    assert by_type["task.failed"]["data"] == {**by_type["task.failed"]["data"], "task": str(blocked.id),
                                              "status": "failed", "retryable": True}
    succeeded = {e["data"]["task"] for e in received if e["type"] == "task.succeeded"}
    assert succeeded == {str(done.id), str(message.id)}
    reply = by_type["message.replied"]["data"]
    assert reply["message"] == str(message.id) and reply["thread"] == "web" and reply["chars"] > 0
    assert "hello" not in json.dumps(reply)  # ids and sizes, never the conversation's text
    # Every delivery succeeded and kept what it posted.
    for delivery in WebhookDelivery.objects.filter(event__tenant=tenant, event__fact_key__isnull=False):
        assert delivery.status == DeliveryStatus.SUCCEEDED
        attempt = delivery.attempt_log.get()
        assert json.loads(attempt.request_body) == event_payload(delivery.event)


@pytest.mark.django_db
def test_one_fact_is_one_event_however_often_it_is_recorded(operator):
    from tenants.models import Tenant

    tenant = Tenant.objects.create(operator=operator, slug="facts", name="Facts")
    kept = event_record(operator_id=operator.pk, tenant=tenant, type="task.succeeded", data={"task": "t"},
                        fact_key="task:t:done:2026-01-01T00:00:00Z")
    assert kept is not None
    again = event_record(operator_id=operator.pk, tenant=tenant, type="task.succeeded", data={"task": "t"},
                         fact_key="task:t:done:2026-01-01T00:00:00Z")
    assert again is None and Event.objects.filter(tenant=tenant).count() == 1
    # The same task blocked later is another fact; another tenant's identical key too.
    assert event_record(operator_id=operator.pk, tenant=tenant, type="task.blocked", data={},
                        fact_key="task:t:blocked:2026-01-01T00:01:00Z") is not None
    other = Tenant.objects.create(operator=operator, slug="facts-2", name="Facts 2")
    assert event_record(operator_id=operator.pk, tenant=other, type="task.succeeded", data={},
                        fact_key="task:t:done:2026-01-01T00:00:00Z") is not None


# --- the delivery log: what was sent and what came back -------------------------------------------------------

class TalkativeReceiver:
    """A real HTTP receiver answering 200 with a long body and headers that carry secrets."""

    def __init__(self, body: bytes) -> None:
        self.posted: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                outer.posted.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Request-Id", "req-42")
                self.send_header("Set-Cookie", "session=receiver-session-secret")
                self.send_header("WWW-Authenticate", 'Bearer realm="receiver-realm-secret"')
                self.send_header("X-Api-Key", "receiver-key-secret")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.django_db
def test_the_delivery_log_keeps_the_body_sent_and_a_bounded_answer_without_secret_headers(settings, make_token):
    from rest_framework.test import APIClient

    settings.WEBHOOK_ALLOW_HTTP = settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_LOG_RESPONSE_BYTES = 1024
    answer = ("ok " + "x" * 3000 + "\x00 end").encode()
    receiver = TalkativeReceiver(answer)
    try:
        operator, portal = _portal("bodies", "bodies.localhost")
        created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
        event = event_record(operator_id=operator.pk, tenant=None, type="task.blocked",
                             data={"task": "t-1", "reason": "poison_step"})
        delivery = WebhookDelivery.objects.get(event=event)
        assert delivery_attempt(delivery_id=str(delivery.pk)).delivery.status == DeliveryStatus.SUCCEEDED
    finally:
        receiver.stop()
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.request_body.encode() == receiver.posted[0]  # byte for byte what was signed and sent
    assert created.secret not in attempt.request_body
    assert attempt.response_body == "ok " + "x" * 1021 and attempt.response_truncated
    assert attempt.response_headers["x-request-id"] == "req-42"
    assert attempt.response_headers["content-type"].startswith("text/plain")
    stored = json.dumps(attempt.response_headers)
    assert "secret" not in stored and "set-cookie" not in stored and "www-authenticate" not in stored

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator)}")
    listed = api.get(f"/api/v1/webhook-endpoints/{created.endpoint.pk}/deliveries")
    assert listed.status_code == 200, listed.content
    shown = listed.json()["results"][0]["attempt_log"][0]
    assert shown["request_body"] == attempt.request_body and shown["response_truncated"] is True
    assert shown["response_headers"] == {k: v for k, v in attempt.response_headers.items()}
    assert len(shown["response_body"]) == 1024 and "secret" not in json.dumps(shown)

    page = portal.get(f"/webhooks/{created.endpoint.pk}/").content.decode()
    assert 'data-testid="request-body"' in page and "poison_step" in page and "req-42" in page
    assert "Only the first 1.0\xa0KB are kept" in page
    assert "receiver-session-secret" not in page and "receiver-key-secret" not in page

    # The staff dashboard's events page shows each event's deliveries with the same log, in a fixed number of
    # queries however many events and attempts the page has.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.process_health import process_health
    from tests.dashboard.test_dashboard_views import _client, _user

    staff = _client(_user("hooks-staff", staff=True))
    process_health()  # the incident banner's state cached (its probe runs once per CACHE_S, not per page)
    with CaptureQueriesContext(connection) as queries:
        board = staff.get("/dashboard/events/")
    assert board.status_code == 200
    body = board.content.decode()
    assert 'data-testid="request-body"' in body and "req-42" in body and "poison_step" in body
    assert "receiver-session-secret" not in body and "receiver-key-secret" not in body
    for n in range(5):
        event_record(operator_id=operator.pk, tenant=None, type="webhook.test", data={"n": n},
                     endpoints=[created.endpoint])
    process_health()
    with CaptureQueriesContext(connection) as more:
        assert body.count('data-testid="event-deliveries"') + 5 == staff.get(
            "/dashboard/events/").content.decode().count('data-testid="event-deliveries"')
    assert len(more) == len(queries)
