"""The history pictures in headless Chromium: drawn, styled by the product's stylesheet, nothing blocked.

The samples are written by the sampler beat runs (``history_sample``) over an hour of changing instance
states; the browser then shows the Fleet page and a tenant's History with the strict CSP in force.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from dashboard.sampling import history_sample
from provisioning.choices import InstanceStatus, RecoveryOutcome
from provisioning.models import AgentInstance, RecoveryEvent
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def _hour_of_samples() -> Tenant:
    """Three instances over the last hour: one recovers for five minutes, one goes stale for ten."""
    operator = operator_create(slug="charts-op", name="Charts Operator", actor=SYSTEM)
    tenants = [Tenant.objects.create(operator=operator, slug=s, name=s.title(), status="ready")
               for s in ("acme", "globex", "initech")]
    instances = [AgentInstance.objects.create(tenant=t, status=InstanceStatus.RUNNING) for t in tenants]
    now = timezone.now()
    for minutes_ago in range(60, 0, -1):
        at = now - timedelta(minutes=minutes_ago)
        recovering = 35 <= minutes_ago < 40
        stale = 10 <= minutes_ago < 20
        AgentInstance.objects.filter(pk=instances[0].pk).update(
            status=InstanceStatus.RECOVERING if recovering else InstanceStatus.RUNNING,
            last_heartbeat_at=at - timedelta(seconds=30 if recovering else 2))
        AgentInstance.objects.filter(pk=instances[1].pk).update(
            last_heartbeat_at=at - timedelta(seconds=90 + 10 * (20 - minutes_ago) if stale else 3))
        AgentInstance.objects.filter(pk=instances[2].pk).update(last_heartbeat_at=at - timedelta(seconds=1))
        assert history_sample(now=at).instances == 3
    detected = now - timedelta(minutes=40)
    RecoveryEvent.objects.create(tenant=tenants[0], instance=instances[0], reason="dead", detected_at=detected,
                                 resumed_at=detected + timedelta(seconds=7.4), outcome=RecoveryOutcome.SUCCEEDED)
    return tenants[0]


def test_fleet_and_tenant_history_charts_render_styled_with_no_csp_violation(page, live_server):
    tenant = _hour_of_samples()
    client = Client()
    client.force_login(User.objects.create_user("charts-staff", password="pw-123456789", is_staff=True))
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": live_server.url}])
    blocked: list[str] = []
    page.on("console", lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None)

    page.goto(f"{live_server.url}/dashboard/fleet/?window=1h")
    chart = page.locator('[data-testid="fleet-chart"] svg')
    expect(chart).to_be_visible()
    assert chart.bounding_box()["width"] > 400
    recovering = chart.locator("polygon.k-recovering")
    expect(recovering).to_have_count(1)
    # The stylesheet's colour for "recovering" (--info), not the SVG default black: the CSS reached the chart.
    assert recovering.evaluate("e => getComputedStyle(e).fill") == "rgb(30, 64, 175)"
    expect(chart.locator("polygon.k-stale")).to_have_count(1)
    expect(page.get_by_test_id("fleet-samples").locator("tbody tr")).to_have_count(10)
    screenshot(page, "dashboard-fleet")

    page.goto(f"{live_server.url}/dashboard/tenants/{tenant.pk}/?history=1h#history")
    heartbeat = page.locator('[data-testid="heartbeat-chart"] svg')
    expect(heartbeat).to_be_visible()
    line = heartbeat.locator("polyline")
    expect(line).to_have_count(1)
    assert line.evaluate("e => getComputedStyle(e).fill") == "none"  # a line, not a filled shape
    assert heartbeat.locator("text", has_text="(max 30 s)").count() == 1
    expect(page.locator('[data-testid="ttr-chart"] svg rect.bar')).to_have_count(1)
    page.get_by_test_id("tenant-history").scroll_into_view_if_needed()
    screenshot(page, "dashboard-tenant-history")
    assert blocked == []


def test_the_tenant_page_is_tabs_without_a_script(page, live_server):
    """Issue 37: the tenant page was ~4,400 px of cards. Its sections are tabs now, shown by the URL's fragment
    with CSS alone (the CSP allows no script of ours); the audit pager's links land on the audit's tab."""
    from tenants.models import AuditLog

    tenant = _hour_of_samples()
    for n in range(25):  # two pages of audit rows
        AuditLog.objects.create(actor_kind="system", actor_label="system", action="tenant.update", tenant=tenant,
                                operator=tenant.operator, target_type="tenant", target_id=str(n))
    client = Client()
    client.force_login(User.objects.create_superuser("tabs-staff", password="pw-123456789"))
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": live_server.url}])
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{live_server.url}/dashboard/tenants/{tenant.pk}/")
    expect(page.get_by_test_id("tab-overview")).to_be_visible()
    for hidden in ("tab-agent", "tab-security", "tab-activity"):
        expect(page.get_by_test_id(hidden)).to_be_hidden()
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 2600, height  # the overview alone
    page.get_by_test_id("tenant-tabs").get_by_role("link", name="Recoveries, audit").click()
    expect(page.get_by_test_id("tab-activity")).to_be_visible()
    expect(page.get_by_test_id("tab-overview")).to_be_hidden()
    page.get_by_role("link", name="Next →").click()  # ?page=2#audit: still on the audit's tab
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    expect(page.get_by_text("Page 2 of 2")).to_be_visible()
    page.get_by_test_id("tenant-tabs").get_by_role("link", name="Egress, credentials, keys").click()
    expect(page.get_by_test_id("tab-security")).to_be_visible()
    expect(page.get_by_test_id("tab-activity")).to_be_hidden()
    print(f"tenant page overview height at 1440 px: {height} px")
