"""Issue 17.4 in the operator portal: webhook endpoints (secret shown once), the delivery log with replay, the
test button. Admins of the host's operator only; another operator's endpoint or delivery is a 404."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.services import operator_create
from webhooks.choices import DeliveryStatus
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import delivery_attempt, endpoint_create

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "hooks-a.localhost", "hooks-b.localhost"


class Receiver:
    """A real HTTP receiver thread that answers 500 until ``healthy`` is set."""

    def __init__(self) -> None:
        self.healthy, self.ids = False, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.ids.append(self.headers["webhook-id"])
                self.send_response(200 if outer.healthy else 500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):  # type: ignore[no-untyped-def]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_RETRY_SCHEDULE_S = [1.0]
    r = Receiver()
    yield r
    r.stop()


def _portal(operator_slug: str, host: str, role: str = "admin") -> tuple[object, Client]:
    operator = operator_create(slug=operator_slug, name=operator_slug.title(), actor=SYSTEM, domains=[host])
    user = User.objects.create_user(f"{operator_slug}-{role}", password="correct horse battery staple")
    OperatorMembership.objects.create(user=user, operator=operator, role=role)
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return operator, client


def test_create_shows_the_secret_once_then_only_its_hint(receiver):
    operator, client = _portal("hooks-a", HOST_A)
    assert 'href="/webhooks/"' in client.get("/").content.decode()  # the nav link
    resp = client.post("/webhooks/", {"url": receiver.url, "event_types": ["tenant.*"]})
    assert resp.status_code == 200 and "no-store" in resp["Cache-Control"]
    endpoint = WebhookEndpoint.objects.get(operator=operator)
    page = resp.content.decode()
    marker = 'data-testid="webhook-secret">'
    secret = page.split(marker, 1)[1].split("<", 1)[0]
    assert secret.startswith("whsec_")
    later = client.get("/webhooks/").content.decode() + client.get(f"/webhooks/{endpoint.pk}/").content.decode()
    assert secret not in later and endpoint.secret_hint in later and receiver.url in later
    refused = client.post("/webhooks/", {"url": "ftp://example.com/x"})
    assert refused.status_code == 400 and WebhookEndpoint.objects.filter(operator=operator).count() == 1


def test_test_button_log_and_replay(receiver):
    operator, client = _portal("hooks-a", HOST_A)
    endpoint = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM).endpoint
    assert client.post(f"/webhooks/{endpoint.pk}/test/").status_code == 302
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    delivery_attempt(delivery_id=str(delivery.pk))  # the receiver answers 500
    failed = delivery_attempt(delivery_id=str(delivery.pk), now=delivery.created_at.replace(year=2100)).delivery
    assert failed.status == DeliveryStatus.FAILED
    log = client.get(f"/webhooks/{endpoint.pk}/").content.decode()
    assert "webhook.test" in log and "HTTP 500" in log and "failing" in log and delivery.event_id in log
    receiver.healthy = True
    assert client.post(f"/webhooks/deliveries/{delivery.pk}/replay/").status_code == 302
    done = delivery_attempt(delivery_id=str(delivery.pk)).delivery
    assert done.status == DeliveryStatus.SUCCEEDED and receiver.ids == [delivery.event_id] * 3
    assert "s-succeeded" in client.get(f"/webhooks/{endpoint.pk}/").content.decode()


def test_members_and_other_operators_are_kept_out(receiver):
    operator, _ = _portal("hooks-a", HOST_A)
    endpoint = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM).endpoint
    _, other_admin = _portal("hooks-b", HOST_B)
    for path in (f"/webhooks/{endpoint.pk}/", f"/webhooks/{endpoint.pk}/delete/"):
        assert other_admin.get(path).status_code == 404
    assert other_admin.post(f"/webhooks/{endpoint.pk}/test/").status_code == 404
    assert receiver.url not in other_admin.get("/webhooks/").content.decode()
    member = User.objects.create_user("hooks-a-member", password="correct horse battery staple")
    OperatorMembership.objects.create(user=member, operator=operator, role="member")
    member_client = Client(HTTP_HOST=HOST_A)
    member_client.force_login(member)
    assert member_client.get("/webhooks/").status_code == 403
    assert not WebhookDelivery.objects.exists() and receiver.ids == []


def test_delete_asks_first_and_keeps_the_log(receiver):
    operator, client = _portal("hooks-a", HOST_A)
    endpoint = endpoint_create(operator=operator, url=receiver.url, actor=SYSTEM).endpoint
    assert "Yes, delete" in client.get(f"/webhooks/{endpoint.pk}/delete/").content.decode()
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).deleted_at is None
    assert client.post(f"/webhooks/{endpoint.pk}/delete/").status_code == 302
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).deleted_at is not None
    assert client.get(f"/webhooks/{endpoint.pk}/").status_code == 404
