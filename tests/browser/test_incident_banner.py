"""The incident banner in headless Chromium (issue 37): a worker whose heartbeat stopped is named at the top of the
overview and of every other staff page, one sentence with since when and a link to the Processes card; at
1440 px and at 390 px the page does not scroll sideways, and no console error."""

from __future__ import annotations

import re
import socket
import time

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import expect

from controlplane.liveness import heartbeat_start, heartbeat_stop, service_beat

from .conftest import at_width, collect_console_errors, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"


def test_a_stale_worker_is_a_banner_on_every_staff_page_at_both_widths(page, live_server):
    import redis

    client = redis.Redis.from_url(settings.HEARTBEAT_REDIS_URL)
    for key in client.scan_iter(f"{settings.HEARTBEAT_KEY_PREFIX}:svc:*"):
        client.delete(key)
    heartbeat_start("beat")  # beat alive (this process); the worker's last heartbeat a minute ago
    now = time.time()
    service_beat("worker", pid=4242, host=socket.gethostname(), started_at=now - 600, now=now - 60,
                 queues=(settings.CELERY_TASK_DEFAULT_QUEUE,))
    User.objects.create_user("oncall-banner", password=PASSWORD, is_staff=True)
    problems = collect_console_errors(page)
    try:
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(f"{live_server.url}/dashboard/")
        page.get_by_label("Username").fill("oncall-banner")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        banner = page.get_by_test_id("incident-banner")
        expect(banner).to_contain_text(re.compile(
            rf"the worker \(queue {re.escape(settings.CELERY_TASK_DEFAULT_QUEUE)}\) has sent no heartbeat since "
            r"\d{4}-\d\d-\d\d [\d:]+ UTC \(no heartbeat from pid 4242 for \d+ s\)"))
        expect(page.locator('[data-testid="service-worker"]')).to_have_attribute("data-state", "stale")
        at_width(page, 1440)
        screenshot(page, "dashboard-processes-banner")

        page.goto(f"{live_server.url}/dashboard/tenants/")
        expect(banner).to_be_visible()
        at_width(page, 390)
        expect(banner).to_be_visible()
        banner.get_by_role("link", name="see the processes").click()
        expect(page).to_have_url(re.compile(r"/dashboard/#processes$"))
        expect(page.get_by_test_id("processes")).to_be_visible()
        at_width(page, 390)
        screenshot(page, "dashboard-processes-banner-390")
        assert not problems, problems
    finally:
        heartbeat_stop("beat")
        client.delete(f"{settings.HEARTBEAT_KEY_PREFIX}:svc:worker")
