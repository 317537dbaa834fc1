"""Issue 17.4: the example receiver (examples/webhook_receiver.py), run as its own process, accepts what the
control plane really sends and refuses forged, expired and tampered requests; a replay is a duplicate."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenants.actors import SYSTEM
from tenants.services import operator_create
from tests.conftest import BASE_DIR
from webhooks.choices import DeliveryStatus
from webhooks.models import Event, WebhookDelivery
from webhooks.services import delivery_attempt, delivery_replay, endpoint_create, event_record
from webhooks.signing import new_secret, signed_headers

pytestmark = pytest.mark.django_db


@pytest.fixture
def example(settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    operator = operator_create(slug="hooks-example", name="Example", actor=SYSTEM)
    # The endpoint is created first (its secret exists only then), pointed at the receiver's port afterwards.
    created = endpoint_create(operator=operator, url="http://127.0.0.1:9/placeholder", actor=SYSTEM)
    events_file = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(BASE_DIR / "examples" / "webhook_receiver.py"), "--port", "0"],
        env={"WEBHOOK_SECRET": created.secret, "WEBHOOK_EVENTS_FILE": str(events_file), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("listening on http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        created.endpoint.url = f"http://127.0.0.1:{port}/webhooks"
        created.endpoint.save(update_fields=["url"])
        yield operator, created, port, events_file
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/webhooks", body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, json.loads(response.read())["result"]
    finally:
        conn.close()


def test_accepts_a_real_delivery_once_and_a_replay_as_a_duplicate(example):
    operator, created, port, events_file = example
    event = event_record(operator_id=operator.pk, tenant=None, type="tenant.created", data={"slug": "acme"})
    delivery = WebhookDelivery.objects.get(event=event)
    assert delivery_attempt(delivery_id=str(delivery.pk)).delivery.status == DeliveryStatus.SUCCEEDED
    delivery_replay(delivery=delivery, actor=SYSTEM)
    assert delivery_attempt(delivery_id=str(delivery.pk)).delivery.status == DeliveryStatus.SUCCEEDED
    lines = events_file.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [event.id]  # processed once, though delivered twice
    assert json.loads(lines[0])["data"] == {"slug": "acme"}
    assert delivery.attempt_log.count() == 2 and all(a.status_code == 200 for a in delivery.attempt_log.all())


def test_refuses_forged_expired_and_tampered_requests(example):
    operator, created, port, events_file = example
    event = Event.objects.create(operator=operator, type="tenant.deleted", data={"slug": "victim"})
    body = json.dumps({"id": event.id, "type": event.type, "data": event.data}).encode()
    now = int(time.time())
    forged = signed_headers(new_secret(), event.id, now, body)
    assert _post(port, body, forged) == (400, "invalid or expired signature")
    expired = signed_headers(created.secret, event.id, now - 3600, body)
    assert _post(port, body, expired)[0] == 400
    valid = signed_headers(created.secret, event.id, now, body)
    assert _post(port, body.replace(b"victim", b"other"), valid)[0] == 400
    assert _post(port, body, {"webhook-id": event.id, "webhook-timestamp": str(now)})[0] == 400  # no signature
    # A signature is bound to its webhook-id: another id with it is refused, and signed for another id the
    # body's own id does not match.
    assert _post(port, body, {**valid, "webhook-id": "evt_someone_else"})[0] == 400
    other_id = signed_headers(created.secret, "evt_someone_else", now, body)
    assert _post(port, body, other_id) == (400, "webhook-id does not match the event")
    assert not events_file.exists()  # nothing refused was processed
    assert _post(port, body, valid) == (200, "accepted")
    assert [json.loads(line)["id"] for line in events_file.read_text().splitlines()] == [event.id]


def test_refuses_to_start_with_a_secret_that_is_not_standard_webhooks():
    """An endpoint secret from before Standard Webhooks, used as it was shown, stops the receiver with a reason
    (docs/webhooks.md says how to convert it) instead of refusing every delivery."""
    legacy = "whsec_3Jq9-vX_0aZ7Lm2Qk8rT4wYb6Nc1Hd5Ef-Gi_Uo9Ps0"
    proc = subprocess.run([sys.executable, str(BASE_DIR / "examples" / "webhook_receiver.py"), "--port", "0"],
                          env={"WEBHOOK_SECRET": legacy, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 1 and "'whsec_' followed by base64" in proc.stderr
