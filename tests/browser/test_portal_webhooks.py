"""An operator admin adds a webhook endpoint in the portal, copies the secret shown once, presses "Send a test
event" and watches the delivery succeed in the log (a real Celery worker posts it to a real receiver, which
checks the signature with the copied secret); a failed delivery is replayed with its button."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.services import operator_create
from webhooks.signing import verify

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-hooks.localhost"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def _reload_until(page, testid: str, text: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while text not in (page.get_by_test_id(testid).first.text_content() or ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {testid}"
        time.sleep(0.5)
        page.reload()


def test_admin_adds_an_endpoint_tests_it_and_replays_a_failure(page, live_port, worker_factory, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    worker_factory(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true", WEBHOOK_RETRY_SCHEDULE_S="")
    receiver = Receiver()
    try:
        operator = operator_create(slug="hookco", name="Hookco", actor=SYSTEM, domains=[HOST])
        admin = User.objects.create_user("hana", password=PASSWORD)
        OperatorMembership.objects.create(user=admin, operator=operator, role="admin")

        page.goto(f"http://{HOST}:{live_port}/webhooks/")
        page.get_by_label("Username").fill("hana")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Webhooks", exact=True)).to_be_visible()
        page.get_by_label("URL").fill(receiver.url)
        page.get_by_role("button", name="Add endpoint").click()
        secret = page.get_by_test_id("webhook-secret").text_content()
        assert secret and secret.startswith("whsec_")
        screenshot(page, "portal-webhooks")

        page.get_by_role("link", name=receiver.url).click()
        page.get_by_role("button", name="Send a test event").click()
        expect(page.get_by_role("status")).to_contain_text("Test event")
        _reload_until(page, "delivery", "succeeded")
        headers, body = receiver.requests[0]
        assert json.loads(body)["type"] == "webhook.test"
        assert verify(secret, headers, body, now=time.time())

        receiver.status = 500  # with no retries configured, the next delivery fails at once
        page.get_by_role("button", name="Send a test event").click()
        _reload_until(page, "delivery", "failed")
        expect(page.get_by_test_id("delivery").first).to_contain_text("HTTP 500")
        _reload_until(page, "endpoint-state", "failing")
        receiver.status = 200
        page.get_by_test_id("delivery").first.get_by_role("button", name="Replay").click()
        expect(page.get_by_role("status")).to_contain_text("queued again")
        _reload_until(page, "delivery", "succeeded")
        _reload_until(page, "endpoint-state", "active")  # one success clears "failing"
        screenshot(page, "portal-webhook-log")
        assert receiver.requests[-1][0]["webhook-id"] == receiver.requests[-2][0]["webhook-id"]
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
