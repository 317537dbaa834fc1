"""Issue 17.4: the events API and operator webhooks, against real PostgreSQL, real HTTP receivers (threads
on loopback) and, for the queue, a real Celery worker.

Receivers that time out, answer 500 or are down for an hour are real servers (or a closed port). The hour
passes on the delivery schedule's own clock: each attempt is made at the time the previous one scheduled
(``delivery_attempt(now=...)``), so nothing sleeps and every recorded time is what production would record.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks import Webhook

from tenants.actors import SYSTEM
from tenants.audit import audit_record, audit_recorded
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from tests.conftest import wait_for
from vault.kek import kek_provider
from webhooks.choices import DeliveryStatus, EndpointStatus
from webhooks.models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import (
    _secret,
    deliveries_queue_due,
    delivery_attempt,
    endpoint_create,
    endpoint_test,
    event_record,
)
from webhooks.signing import new_secret, secret_key, sign, verify

SCHEDULE = [10, 60, 300, 900, 1800, 3600, 7200, 14400]  # the default: about 8 hours in all


class Receiver:
    """A real HTTP receiver on loopback: answers ``status`` (or hangs ``delay_s`` first), records requests."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status, self.delay_s = 200, 0.0
        self.answers: list[int] = []  # consumed first, then ``status``
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                code = outer.answers.pop(0) if outer.answers else outer.status
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up (timeout)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (a receiver that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def loopback_webhooks(settings):  # type: ignore[no-untyped-def]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_TIMEOUT_S = 0.5
    settings.WEBHOOK_RETRY_SCHEDULE_S = SCHEDULE
    return settings


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def make_tenant(operator, slug: str = "acme") -> Tenant:  # type: ignore[no-untyped-def]
    """A tenant row and its onboarding audit row (what ``tenant_onboard`` writes before its workflow)."""
    with transaction.atomic():
        tenant = Tenant.objects.create(operator=operator, slug=slug, name=slug.title())
        audit_record(actor=SYSTEM, action=AuditAction.TENANT_ONBOARD, target=tenant, tenant=tenant, data={"slug": slug})
    return tenant


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


# --- events -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_state_changes_become_events_in_their_own_transaction(operator):
    tenant = make_tenant(operator)
    tenant_transition(tenant=tenant, to=TenantStatus.PROVISIONING, actor=SYSTEM)
    tenant_transition(tenant=tenant, to=TenantStatus.READY, actor=SYSTEM)
    tenant_transition(tenant=tenant, to=TenantStatus.SUSPENDED, actor=SYSTEM)
    tenant_transition(tenant=tenant, to=TenantStatus.READY, actor=SYSTEM)
    with pytest.raises(RuntimeError), transaction.atomic():
        tenant_transition(tenant=tenant, to=TenantStatus.SUSPENDED, actor=SYSTEM)
        raise RuntimeError("the change rolls back, and its event with it")
    types = list(Event.objects.filter(operator=operator).order_by("id").values_list("type", flat=True))
    assert types == ["tenant.created", "tenant.provisioning", "tenant.ready", "tenant.suspended", "tenant.resumed"]
    resumed = Event.objects.get(type="tenant.resumed")
    assert resumed.data == {"slug": "acme", "status": "ready", "previous_status": "suspended"}
    assert resumed.tenant_id == tenant.pk and resumed.id.startswith("evt_")


@pytest.mark.django_db
def test_audit_rows_reach_webhooks_through_a_signal_sent_inside_their_transaction(operator):
    """tenants imports no app above it: ``audit_record`` sends ``audit_recorded`` and webhooks listens (connected in
    its AppConfig.ready). Sent synchronously, not on commit: a receiver that fails rolls the change back, and the
    event written before it goes with it."""
    assert audit_recorded.has_listeners(AuditLog)
    events_before = Event.objects.count()
    received = []

    def failing(sender, *, row, tenant, **kwargs):  # type: ignore[no-untyped-def]
        received.append((row.action, Event.objects.filter(tenant=tenant).count()))
        raise RuntimeError("a receiver's failure is the change's")

    audit_recorded.connect(failing, dispatch_uid="test-failing-receiver")
    try:
        with pytest.raises(RuntimeError):
            make_tenant(operator, slug="rolled-back")
    finally:
        audit_recorded.disconnect(dispatch_uid="test-failing-receiver")
    assert received == [(AuditAction.TENANT_ONBOARD, 1)]  # webhooks' receiver ran first, in the same transaction
    assert not Tenant.objects.filter(slug="rolled-back").exists() and Event.objects.count() == events_before


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "data", "expected"), [
    ("tenant.update", {"name": {"from": "A", "to": "B"}, "metadata": ["crm"]},
     ("tenant.updated", {"slug": "acme", "changed": ["metadata", "name"]})),
    ("instance.start", {"external_id": "pid:123"}, ("instance.started", {})),
    ("instance.stop", {"planned": True}, ("instance.stopped", {"planned": True})),
    ("instance.recovery.start", {"reason": "dead", "detail": "/var/lib/secret-path"},
     ("recovery.started", {"reason": "dead"})),
    ("instance.recovery.quarantined", {"failures_in_window": 3}, ("recovery.quarantined", {})),
    ("instance.recovery.succeeded", {"steps_lost": 1}, ("recovery.succeeded", {"steps_lost": 1})),
    ("task.submit", {"item": "i-1", "kind": "demo"}, ("task.submitted", {"inbox_item": "i-1", "kind": "demo"})),
    ("effect.decide", {"item": "i-2", "effect": "t:pay", "decision": "performed"},
     ("effect.decided", {"inbox_item": "i-2", "effect": "t:pay", "decision": "performed"})),
])
def test_instance_recovery_task_and_effect_actions_are_public_events_without_internal_detail(
        operator, action, data, expected):
    tenant = make_tenant(operator)
    audit_record(actor=SYSTEM, action=AuditAction(action), target=tenant, tenant=tenant, data=data)
    event = Event.objects.filter(operator=operator).exclude(type="tenant.created").get()
    expected_type, expected_data = expected
    assert event.type == expected_type
    assert {k: v for k, v in event.data.items() if k != "recovery"} == expected_data
    assert "/var/lib" not in json.dumps(event.data) and "pid:" not in json.dumps(event.data)


@pytest.mark.django_db
def test_internal_actions_are_not_events(operator):
    tenant = make_tenant(operator)
    for action in ("credential.put", "operator_token.issue", "resource.provision", "vault.object_keys.deliver"):
        audit_record(actor=SYSTEM, action=AuditAction(action), tenant=tenant, data={"name": "x"})
    assert list(Event.objects.values_list("type", flat=True)) == ["tenant.created"]


@pytest.mark.django_db
def test_events_api_pages_by_cursor_filters_and_hides_other_operators(operator, make_token):
    other = operator_create(slug=f"{operator.slug}-b", name="B", actor=SYSTEM)
    tenants = [make_tenant(operator, f"t{i}") for i in range(5)]
    for t in tenants[:3]:
        tenant_transition(tenant=t, to=TenantStatus.PROVISIONING, actor=SYSTEM)
    theirs = make_tenant(other, "theirs")
    api = client_for(make_token(operator, ["events:read"]))
    seen: list[str] = []
    url: str | None = "/api/v1/events?limit=3"
    while url:
        page = api.get(url)
        assert page.status_code == 200, page.content
        seen += [e["id"] for e in page.json()["results"]]
        url = page.json()["next"]
    mine = list(Event.objects.filter(operator=operator).order_by("-id").values_list("id", flat=True))
    assert seen == mine and len(mine) == 8  # newest first, each once, across three pages
    assert not Event.objects.filter(operator=other, id__in=seen).exists()
    created = api.get("/api/v1/events", {"type": "tenant.created"}).json()["results"]
    assert {e["data"]["slug"] for e in created} == {f"t{i}" for i in range(5)}
    one = api.get("/api/v1/events", {"tenant": str(tenants[0].pk), "type": "tenant.*"}).json()["results"]
    assert [e["type"] for e in one] == ["tenant.provisioning", "tenant.created"]
    later = api.get("/api/v1/events", {"created_after": (timezone.now() + timedelta(minutes=1)).isoformat()})
    assert later.json()["results"] == []
    event = Event.objects.filter(operator=operator).first()
    assert api.get(f"/api/v1/events/{event.id}").json()["id"] == event.id
    their_event = Event.objects.get(tenant=theirs)
    assert api.get(f"/api/v1/events/{their_event.id}").status_code == 404
    assert api.get("/api/v1/events", {"tenant": str(theirs.pk)}).json()["results"] == []


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "named"), [
    ({"limit": "abc"}, "limit"), ({"limit": "0"}, "limit"), ({"typo": "x"}, "typo"),
    ({"type": "tenant.exploded"}, "tenant.exploded"), ({"cursor": "not-a-cursor"}, "cursor"),
    ({"created_after": "yesterday"}, "created_after"), ({"tenant": "nope"}, "tenant"),
])
def test_events_api_refuses_bad_parameters_by_name(api, query, named):
    resp = api.get("/api/v1/events", query)
    # A cursor the API never gave out names no page: 404 (documented for cursor lists), like DRF's own.
    assert resp.status_code == (404 if "cursor" in query else 400), resp.content
    assert resp["Content-Type"] == "application/problem+json" and named in resp.json()["detail"]


@pytest.mark.django_db
def test_scopes_are_enforced(operator, make_token):
    read_only = client_for(make_token(operator, ["tenants:read"]))
    assert read_only.get("/api/v1/events").status_code == 403
    assert read_only.get("/api/v1/webhook-endpoints").status_code == 403
    webhooks_read = client_for(make_token(operator, ["webhooks:read"]))
    assert webhooks_read.get("/api/v1/webhook-endpoints").status_code == 200
    assert webhooks_read.post("/api/v1/webhook-endpoints", {"url": "https://93.184.216.34/h"},
                              format="json").status_code == 403


# --- endpoints --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_endpoint_secret_is_shown_once_and_stored_wrapped(api, loopback_webhooks, receiver):
    resp = api.post("/api/v1/webhook-endpoints", {"url": receiver.url, "event_types": ["tenant.*"]}, format="json")
    assert resp.status_code == 201, resp.content
    secret = resp.json()["secret"]
    assert secret.startswith("whsec_") and resp["Cache-Control"] == "no-store"
    endpoint_id = resp.json()["id"]
    again = api.get(f"/api/v1/webhook-endpoints/{endpoint_id}").json()
    listed = api.get("/api/v1/webhook-endpoints").content.decode()
    assert "secret" not in again and secret not in json.dumps(again) and secret not in listed
    assert again["secret_hint"].endswith(secret[-4:])
    row = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert secret.encode() not in bytes(row.secret_blob)
    assert secret not in json.dumps(list(AuditLog.objects.values("data", "actor_label")), default=str)


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "why"), [
    ("http://93.184.216.34/hook", "https"),
    ("https://127.0.0.1/hook", "private"),
    ("https://169.254.169.254/latest/meta-data", "private"),  # cloud metadata
    ("https://10.1.2.3/hook", "private"),
    ("https://[::1]/hook", "private"),
    ("https://user:pw@93.184.216.34/hook", "credentials"),
    ("https://no-such-host.invalid/hook", "resolve"),
    ("https://[0]/hook", "https://<host>"),  # a bracketed host that is no IPv6 address: was a 500
    ("https://[1:2:3]/hook", "https://<host>"),  # no IPv6 address: the pattern refuses it now (issue 37: `[:]`)
])
def test_endpoint_urls_that_could_reach_inside_are_refused(api, settings, url, why):
    settings.WEBHOOK_ALLOW_HTTP = False
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    resp = api.post("/api/v1/webhook-endpoints", {"url": url}, format="json")
    assert resp.status_code == 400 and why in resp.json()["detail"], resp.content
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
def test_a_public_https_endpoint_is_accepted_and_strict_input_is_enforced(api, settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    ok = api.post("/api/v1/webhook-endpoints", {"url": "https://93.184.216.34/hook"}, format="json")
    assert ok.status_code == 201, ok.content
    endpoint = ok.json()["id"]
    unknown = api.post("/api/v1/webhook-endpoints", {"url": "https://93.184.216.34/h", "is_admin": True},
                       format="json")
    assert unknown.status_code == 400 and "is_admin" in unknown.json()["detail"]
    bad_types = api.post("/api/v1/webhook-endpoints", {"url": "https://93.184.216.34/h", "event_types": ["x.y"]},
                         format="json")
    assert bad_types.status_code == 400 and "x.y" in bad_types.json()["detail"]
    not_bool = api.patch(f"/api/v1/webhook-endpoints/{endpoint}", {"is_active": 0}, format="json")
    assert not_bool.status_code == 400
    paused = api.patch(f"/api/v1/webhook-endpoints/{endpoint}", {"is_active": False}, format="json")
    assert paused.status_code == 200 and paused.json()["is_active"] is False
    assert api.delete(f"/api/v1/webhook-endpoints/{endpoint}").status_code == 204
    assert api.get(f"/api/v1/webhook-endpoints/{endpoint}").status_code == 404
    assert WebhookEndpoint.objects.filter(pk=endpoint, deleted_at__isnull=False).exists()  # kept, not listed


@pytest.mark.django_db
def test_another_operators_endpoint_and_delivery_are_not_found(operator, make_token, loopback_webhooks, receiver):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    other = operator_create(slug=f"{operator.slug}-x", name="X", actor=SYSTEM)
    intruder = client_for(make_token(other))
    e = created.endpoint.pk
    assert intruder.get(f"/api/v1/webhook-endpoints/{e}").status_code == 404
    assert intruder.patch(f"/api/v1/webhook-endpoints/{e}", {"url": receiver.url}, format="json").status_code == 404
    assert intruder.delete(f"/api/v1/webhook-endpoints/{e}").status_code == 404
    assert intruder.post(f"/api/v1/webhook-endpoints/{e}/test").status_code == 404
    assert intruder.get(f"/api/v1/webhook-endpoints/{e}/deliveries").status_code == 404
    assert intruder.post(f"/api/v1/webhook-deliveries/{delivery.pk}/replay").status_code == 404
    assert str(e) not in intruder.get("/api/v1/webhook-endpoints").content.decode()
    assert WebhookEndpoint.objects.get(pk=e).deleted_at is None and receiver.requests == []


# --- delivery ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_delivery_is_signed_and_carries_the_event_the_api_shows(operator, api, loopback_webhooks, receiver):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    tenant = make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    result = delivery_attempt(delivery_id=str(delivery.pk))
    assert result.posted and result.delivery.status == DeliveryStatus.SUCCEEDED
    (request,) = receiver.requests
    headers, body = request["headers"], request["body"]
    event = Event.objects.get(tenant=tenant)
    assert headers["webhook-id"] == event.id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert verify(created.secret, headers, body, now=time.time())
    assert not verify(new_secret(), headers, body, now=time.time())
    assert not verify(created.secret, headers, body + b" ", now=time.time())
    assert not verify(created.secret, {**headers, "webhook-id": "evt_another"}, body, now=time.time())
    # An independent implementation of the spec accepts it too (the signature is not ours alone).
    assert Webhook(created.secret).verify(body, headers, json_parse=False) is None
    assert json.loads(body) == api.get(f"/api/v1/events/{event.id}").json()
    assert created.secret not in json.dumps(list(WebhookAttempt.objects.values()), default=str)
    again = delivery_attempt(delivery_id=str(delivery.pk))
    assert not again.posted and len(receiver.requests) == 1  # a duplicate message posts nothing


def test_a_kek_rotation_rewraps_signing_secrets_and_deliveries_still_verify(operator, loopback_webhooks, receiver):
    """A signing secret is wrapped by the key-encryption key itself: a rotation re-wraps it (it was left under the
    old key, which then could never leave the ring), and a delivery after the old key is gone signs with the same
    secret the receiver was given at creation."""
    from tests.vault.test_vault_helpers import ring_add_version
    from vault.rotation import kek_rotate_start, rotation_job_execute
    from vault.selectors import kek_ids_in_use

    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    blob_before = bytes(created.endpoint.secret_blob)
    old_kek = created.endpoint.secret_kek_id
    loopback_webhooks.VAULT_KEK_KEYRING = ring_add_version(loopback_webhooks.VAULT_KEK_KEYRING, "v9")
    job = kek_rotate_start(actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    endpoint = WebhookEndpoint.objects.get(pk=created.endpoint.pk)
    assert endpoint.secret_kek_id == "local:v9" != old_kek and bytes(endpoint.secret_blob) != blob_before
    job.refresh_from_db()
    assert job.details["rewrapped_secrets"]["webhook_endpoint_secrets"] >= 1
    assert old_kek not in kek_ids_in_use()
    again = kek_rotate_start(actor=SYSTEM)
    assert rotation_job_execute(str(again.pk)) == "succeeded"
    again.refresh_from_db()
    assert again.details["rewrapped_secrets"]["webhook_endpoint_secrets"] == 0  # nothing left: nothing twice

    # The old key leaves the ring: the endpoint still signs, with the secret the receiver holds.
    loopback_webhooks.VAULT_KEK_KEYRING = ",".join(
        part for part in loopback_webhooks.VAULT_KEK_KEYRING.split(",") if part.startswith("v9:"))
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery_attempt(delivery_id=str(delivery.pk)).posted
    (request,) = receiver.requests
    assert verify(created.secret, request["headers"], request["body"], now=time.time())


@pytest.mark.django_db
def test_an_endpoint_from_before_standard_webhooks_keeps_its_key(operator, loopback_webhooks, receiver):
    """Issue 36: a secret made before Standard Webhooks (``whsec_`` + ``token_urlsafe(32)``, the whole string
    the HMAC key) is rewritten by the data migration as ``whsec_`` + base64(old secret): the key it always had,
    now read the same way by any Standard Webhooks library. Secrets made since are left alone; it undoes."""
    from django.apps import apps

    migration = importlib.import_module("webhooks.migrations.0003_standard_webhooks_secrets")
    old = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM).endpoint
    legacy = "whsec_" + secrets.token_urlsafe(32)
    wrapped = kek_provider().wrap(f"webhook-endpoint:{old.pk}", legacy.encode())
    WebhookEndpoint.objects.filter(pk=old.pk).update(
        secret_kek_id=wrapped.kek_id, secret_blob=wrapped.blob, secret_fingerprint=wrapped.fingerprint or "",
        secret_hint=f"whsec_…{legacy[-4:]}")
    recent = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    recent_blob = bytes(recent.endpoint.secret_blob)

    migration.forwards(apps, None)
    converted = "whsec_" + base64.b64encode(legacy.encode()).decode()
    old.refresh_from_db()
    assert _secret(old) == converted and old.secret_hint == f"whsec_…{converted[-4:]}"
    assert bytes(WebhookEndpoint.objects.get(pk=recent.endpoint.pk).secret_blob) == recent_blob
    blob = bytes(old.secret_blob)
    migration.forwards(apps, None)  # twice changes nothing
    old.refresh_from_db()
    assert bytes(old.secret_blob) == blob

    event = event_record(operator_id=operator.pk, tenant=None, type="tenant.created", data={}, endpoints=[old])
    assert delivery_attempt(delivery_id=str(WebhookDelivery.objects.get(event=event).pk)).posted
    headers, body = receiver.requests[-1]["headers"], receiver.requests[-1]["body"]
    assert Webhook(converted).verify(body, headers)["id"] == event.id
    mac = hmac.new(legacy.encode(), f"{event.id}.{headers['webhook-timestamp']}.".encode() + body, hashlib.sha256)
    assert headers["webhook-signature"] == "v1," + base64.b64encode(mac.digest()).decode()  # the old key

    migration.backwards(apps, None)
    old.refresh_from_db()
    assert _secret(old) == legacy and _secret(recent.endpoint) == recent.secret


@pytest.mark.django_db
def test_endpoint_type_filter_and_pause_decide_what_is_delivered(operator, loopback_webhooks, receiver):
    only_recovery = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM, event_types=["recovery.*"])
    paused = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    WebhookEndpoint.objects.filter(pk=paused.endpoint.pk).update(is_active=False)
    tenant = make_tenant(operator)
    audit_record(actor=SYSTEM, action=AuditAction.INSTANCE_RECOVERY_START, target=tenant, tenant=tenant,
                 data={"reason": "x"})
    types = list(WebhookDelivery.objects.values_list("endpoint_id", "event__type"))
    assert types == [(only_recovery.endpoint.pk, "recovery.started")]
    # The test button reaches an endpoint whatever its filter (and only that endpoint).
    tested = endpoint_test(endpoint=only_recovery.endpoint, actor=SYSTEM)
    assert tested.event.type == "webhook.test" and tested.endpoint_id == only_recovery.endpoint.pk
    assert WebhookDelivery.objects.filter(event=tested.event).count() == 1


@pytest.mark.django_db
def test_a_receiver_answering_500_is_retried_on_the_schedule_until_it_answers(operator, loopback_webhooks, receiver):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    receiver.answers = [500, 503]
    start = timezone.now()
    first = delivery_attempt(delivery_id=str(delivery.pk), now=start).delivery
    assert first.status == DeliveryStatus.PENDING and first.last_status_code == 500
    assert first.next_attempt_at == start + timedelta(seconds=SCHEDULE[0])
    early = delivery_attempt(delivery_id=str(delivery.pk), now=start + timedelta(seconds=1))
    assert not early.posted  # not due yet
    second = delivery_attempt(delivery_id=str(delivery.pk), now=first.next_attempt_at).delivery
    assert second.last_status_code == 503 and second.next_attempt_at == first.next_attempt_at + timedelta(
        seconds=SCHEDULE[1])
    third = delivery_attempt(delivery_id=str(delivery.pk), now=second.next_attempt_at).delivery
    assert third.status == DeliveryStatus.SUCCEEDED and third.attempts == 3
    assert [a.status_code for a in WebhookAttempt.objects.filter(delivery=delivery)] == [500, 503, 200]
    assert len({r["headers"]["webhook-id"] for r in receiver.requests}) == 1  # one event id to de-duplicate on


@pytest.mark.django_db
def test_a_receiver_that_times_out_is_an_attempt_that_failed_in_time(operator, loopback_webhooks, receiver):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    receiver.delay_s = 3.0
    began = time.monotonic()
    result = delivery_attempt(delivery_id=str(delivery.pk)).delivery
    assert time.monotonic() - began < 2.5  # the 0.5 s timeout, not the receiver's 3 s
    assert result.status == DeliveryStatus.PENDING and "timed out" in result.last_error
    assert result.next_attempt_at is not None and result.lease_until is None


@pytest.mark.django_db
def test_a_receiver_down_for_an_hour_gets_the_event_when_it_is_back(operator, loopback_webhooks):
    port = closed_port()
    created = endpoint_create(operator=operator, url=f"http://127.0.0.1:{port}/hooks", actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    start = clock = timezone.now()
    back_at = start + timedelta(hours=1)
    receiver = None
    try:
        while True:
            if clock >= back_at and receiver is None:
                receiver = Receiver(port)  # the hour is over: the receiver is up again, on its port
            result = delivery_attempt(delivery_id=str(delivery.pk), now=clock).delivery
            if result.status != DeliveryStatus.PENDING:
                break
            clock = result.next_attempt_at
        assert result.status == DeliveryStatus.SUCCEEDED
        attempts = list(WebhookAttempt.objects.filter(delivery=delivery))
        assert all(a.error == "connection refused" for a in attempts[:-1]) and attempts[-1].status_code == 200
        assert attempts[-2].attempted_at < back_at <= attempts[-1].attempted_at
        assert len(attempts) == 7  # 10 s, 1 min, 5 min, 15 min, 30 min, 1 h: the 7th attempt is past the hour
        assert WebhookEndpoint.objects.get(pk=created.endpoint.pk).status == EndpointStatus.ACTIVE
        assert receiver is not None and len(receiver.requests) == 1
    finally:
        if receiver is not None:
            receiver.stop()


@pytest.mark.django_db
def test_a_receiver_down_past_the_schedule_marks_the_endpoint_failing_and_loses_nothing(
        operator, api, loopback_webhooks):
    port = closed_port()
    created = endpoint_create(operator=operator, url=f"http://127.0.0.1:{port}/hooks", actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    clock = start = timezone.now()
    while True:
        result = delivery_attempt(delivery_id=str(delivery.pk), now=clock).delivery
        if result.status != DeliveryStatus.PENDING:
            break
        clock = result.next_attempt_at
    assert result.status == DeliveryStatus.FAILED and result.attempts == len(SCHEDULE) + 1
    assert clock - start > timedelta(hours=7)
    endpoint = WebhookEndpoint.objects.get(pk=created.endpoint.pk)
    assert endpoint.status == EndpointStatus.FAILING and endpoint.failing_since is not None
    shown = api.get(f"/api/v1/webhook-endpoints/{endpoint.pk}").json()
    assert shown["status"] == "failing"
    # Nothing lost: the failed delivery and every attempt are kept, and new events still get deliveries.
    assert WebhookAttempt.objects.filter(delivery=delivery).count() == len(SCHEDULE) + 1
    tenant_transition(tenant=Tenant.objects.get(operator=operator), to=TenantStatus.PROVISIONING, actor=SYSTEM)
    assert WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).count() == 1
    log = api.get(f"/api/v1/webhook-endpoints/{endpoint.pk}/deliveries", {"status": "failed"}).json()["results"]
    assert [d["id"] for d in log] == [str(delivery.pk)] and len(log[0]["attempt_log"]) == len(SCHEDULE) + 1
    # The receiver is fixed; replay sends the same event again.
    receiver = Receiver(port)
    try:
        replayed = api.post(f"/api/v1/webhook-deliveries/{delivery.pk}/replay")
        assert replayed.status_code == 202 and replayed.json()["status"] == "pending"
        done = delivery_attempt(delivery_id=str(delivery.pk)).delivery
        assert done.status == DeliveryStatus.SUCCEEDED and done.replays == 1
        assert receiver.requests[0]["headers"]["webhook-id"] == delivery.event_id
        assert WebhookEndpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.ACTIVE
    finally:
        receiver.stop()


@pytest.mark.django_db
def test_a_url_that_now_resolves_inside_is_refused_at_delivery(operator, loopback_webhooks, receiver, settings):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    make_tenant(operator)
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False  # e.g. its DNS now answers with a loopback address
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    result = delivery_attempt(delivery_id=str(delivery.pk)).delivery
    assert result.status == DeliveryStatus.PENDING and result.last_error.startswith("refused:")
    assert receiver.requests == []


# --- the queue: a real Celery worker ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_worker_retries_with_backoff_and_the_sweep_requeues_lost_messages(
        worker_factory, make_token, loopback_webhooks, receiver):
    operator = operator_create(slug=f"op-wh-{int(time.time())}", name="Webhooks", actor=SYSTEM)
    loopback_webhooks.WEBHOOK_RETRY_SCHEDULE_S = [0.5, 0.5, 0.5]
    worker = worker_factory(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true",
                            WEBHOOK_TIMEOUT_S="2", WEBHOOK_RETRY_SCHEDULE_S="0.5,0.5,0.5")
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    receiver.answers = [500, 500]
    make_tenant(operator)  # the event commits; its delivery is queued after commit
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    wait_for(lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == DeliveryStatus.SUCCEEDED, timeout=60,
             what=f"the worker to deliver after two 500s\n{worker.log()[-3000:]}")
    assert [r["headers"]["webhook-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    assert len({r["headers"]["webhook-id"] for r in receiver.requests}) == 1
    # The test button, through the API and the same queue.
    api = client_for(make_token(operator))
    test = api.post(f"/api/v1/webhook-endpoints/{created.endpoint.pk}/test")
    assert test.status_code == 202 and test.json()["event"]["type"] == "webhook.test"
    wait_for(lambda: len(receiver.requests) == 4, timeout=30, what="the test event")
    assert json.loads(receiver.requests[3]["body"])["type"] == "webhook.test"
    # A delivery whose queued message was lost (broker restart): the sweep finds it once it is overdue.
    lost = event_record(operator_id=operator.pk, tenant=None, type="tenant.created", data={}, endpoints=[])
    orphan = WebhookDelivery.objects.create(endpoint=created.endpoint, event=lost,
                                            next_attempt_at=timezone.now() - timedelta(minutes=5))
    assert deliveries_queue_due() >= 1
    wait_for(lambda: WebhookDelivery.objects.get(pk=orphan.pk).status == DeliveryStatus.SUCCEEDED, timeout=30,
             what="the swept delivery")
    assert receiver.requests[-1]["headers"]["webhook-id"] == lost.id


def test_new_secrets_are_standard_webhooks_secrets() -> None:
    secrets_made = {new_secret() for _ in range(50)}
    assert len(secrets_made) == 50
    for secret in secrets_made:
        assert secret.startswith("whsec_") and len(secret) == 6 + 44  # base64 of 32 random bytes
        assert len(secret_key(secret)) == 32
        # The reference library reads the same key from it.
        stamp = datetime.fromtimestamp(1700000000, tz=UTC)
        assert Webhook(secret).sign("evt_1", stamp, "{}") == sign(secret, "evt_1", 1700000000, b"{}")


@pytest.mark.django_db
@pytest.mark.parametrize("bad_id", ["not-a-uuid", "0" * 40, "%00"])
def test_ids_that_are_not_ids_are_404(api, bad_id):
    for path in (f"/api/v1/webhook-endpoints/{bad_id}", f"/api/v1/webhook-endpoints/{bad_id}/deliveries",
                 f"/api/v1/events/{bad_id}"):
        resp = api.get(path)
        assert resp.status_code in (400, 404) and resp["Content-Type"] == "application/problem+json", path
    assert api.post(f"/api/v1/webhook-deliveries/{bad_id}/replay").status_code in (400, 404)


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_request_leaves_the_delivery_to_be_posted_again(worker_factory, loopback_webhooks,
                                                                            receiver):
    """At least once: the receiver saw the first request, the worker died before recording the answer; after
    the lease the sweep queues it again and a new worker posts it with the same ``webhook-id``."""
    operator = operator_create(slug=f"op-whk-{int(time.time())}", name="Webhooks", actor=SYSTEM)
    loopback_webhooks.WEBHOOK_SWEEP_GRACE_S = 0
    env = dict(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true", WEBHOOK_TIMEOUT_S="30",
               WEBHOOK_LEASE_S="3")
    worker = worker_factory(**env)
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    receiver.delay_s = 60.0  # the first request hangs: the worker is inside the POST when it is killed
    make_tenant(operator)
    wait_for(lambda: len(receiver.requests) == 1, timeout=60, what=f"the first request\n{worker.log()[-2000:]}")
    worker.kill()
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    assert delivery.status == DeliveryStatus.PENDING and delivery.lease_until is not None
    assert not WebhookAttempt.objects.filter(delivery=delivery).exists()  # the outcome was never recorded
    receiver.delay_s = 0.0
    worker_factory(**env)
    assert deliveries_queue_due() == 0  # still leased: nobody posts it twice at once
    wait_for(lambda: deliveries_queue_due() == 1, timeout=30, what="the lease to expire")
    wait_for(lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == DeliveryStatus.SUCCEEDED, timeout=60,
             what="the second worker to post it")
    assert len(receiver.requests) == 2
    assert receiver.requests[0]["headers"]["webhook-id"] == receiver.requests[1]["headers"]["webhook-id"]
    assert receiver.requests[1]["body"] == receiver.requests[0]["body"]


def _self_signed(tmp_path):  # type: ignore[no-untyped-def]
    """A certificate for ``localhost`` (and 127.0.0.1) that no system trust store knows."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.mark.django_db
def test_https_receivers_are_verified_against_the_urls_host_name(operator, loopback_webhooks, tmp_path,
                                                                 monkeypatch):
    import ssl

    cert_path, key_path = _self_signed(tmp_path)
    receiver = Receiver()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert_path, key_path)
    receiver.server.socket = tls.wrap_socket(receiver.server.socket, server_side=True)
    try:
        url = f"https://localhost:{receiver.port}/hooks"
        created = endpoint_create(operator=operator, url=url, actor=SYSTEM)
        make_tenant(operator)
        delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
        untrusted = delivery_attempt(delivery_id=str(delivery.pk)).delivery
        assert untrusted.last_error.startswith("TLS error") and receiver.requests == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # now the receiver's certificate is trusted
        trusted = delivery_attempt(delivery_id=str(delivery.pk), now=untrusted.next_attempt_at).delivery
        assert trusted.status == DeliveryStatus.SUCCEEDED
        assert receiver.requests[0]["headers"]["host"] == f"localhost:{receiver.port}"
    finally:
        receiver.stop()


@pytest.mark.django_db
def test_long_waits_are_queued_by_the_sweep_when_due_and_short_ones_by_their_countdown(
        operator, loopback_webhooks, receiver):
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    make_tenant(operator)
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    receiver.status = 500
    t0 = timezone.now()
    first = delivery_attempt(delivery_id=str(delivery.pk), now=t0).delivery  # next in 10 s: a countdown
    assert deliveries_queue_due(now=first.next_attempt_at) == 0  # its message is in the queue
    assert deliveries_queue_due(now=first.next_attempt_at + timedelta(seconds=31)) == 1  # ...or was lost
    second = delivery_attempt(delivery_id=str(delivery.pk), now=first.next_attempt_at).delivery  # next in 60 s
    third = delivery_attempt(delivery_id=str(delivery.pk), now=second.next_attempt_at).delivery  # next in 5 min
    assert third.next_attempt_at - third.last_attempt_at == timedelta(seconds=300)
    assert deliveries_queue_due(now=third.next_attempt_at - timedelta(seconds=1)) == 0  # not due yet
    assert deliveries_queue_due(now=third.next_attempt_at) == 1  # due, and no message will bring it


@pytest.mark.django_db(transaction=True)
def test_the_worker_leaves_a_long_wait_to_the_sweep(worker_factory, loopback_webhooks, receiver):
    operator = operator_create(slug=f"op-whs-{int(time.time())}", name="Webhooks", actor=SYSTEM)
    loopback_webhooks.WEBHOOK_COUNTDOWN_MAX_S = 0.0
    loopback_webhooks.WEBHOOK_RETRY_SCHEDULE_S = [0.5]
    worker = worker_factory(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true",
                            WEBHOOK_RETRY_SCHEDULE_S="0.5", WEBHOOK_COUNTDOWN_MAX_S="0")
    created = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM)
    receiver.answers = [500]
    make_tenant(operator)
    wait_for(lambda: len(receiver.requests) == 1, timeout=60, what=f"the first attempt\n{worker.log()[-2000:]}")
    time.sleep(2.0)  # well past the 0.5 s wait: no countdown message was left behind
    delivery = WebhookDelivery.objects.get(endpoint=created.endpoint)
    assert len(receiver.requests) == 1 and delivery.status == DeliveryStatus.PENDING
    assert deliveries_queue_due() == 1
    wait_for(lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == DeliveryStatus.SUCCEEDED, timeout=30,
             what="the swept retry")
    assert len(receiver.requests) == 2
