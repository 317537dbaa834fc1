"""The screens issue 37's rough edges added or changed, in headless Chromium at 1440 px and at 390 px: the portal's
model prices (the list, and the form refused with its message next to the field), a task's Cancel confirm page
(dashboard and portal), the dashboard tenant page's four tabs, the fleet chart's dated axis on a new install, and
a suspended customer's status card. At each width the page does not scroll sideways and logs no console error (the
favicon included: every page links one). Each also checks what the screen is for, so a screenshot of a broken
page fails the test instead of landing in docs/ui.md.

The instance is the protocol stub (tests/instance_stub.py): what is under test is how the pages draw it.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from playwright.sync_api import expect

from dashboard.sampling import history_sample
from portal.models import OperatorMembership
from provisioning.choices import InstanceStatus, RecoveryOutcome, StepStatus, WorkflowKind, WorkflowStatus
from provisioning.models import AgentInstance, RecoveryEvent, WorkflowRun, WorkflowStep
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from usage.models import ModelPrice

from ..conversation_helpers import stub_tenant
from .conftest import WIDTHS, at_width, collect_console_errors, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-edges.localhost"
TASK = "0c4ac3e1-0000-4000-8000-00000000037c"
TABS = {"overview": "Overview", "agent": "Agent", "security": "Egress, credentials, keys",
        "activity": "Recoveries, audit"}


@pytest.fixture
def edges(processes_alive):
    """An operator with its portal host, an admin member and a staff user with every dashboard permission, and a
    ready customer whose stub instance has a running task."""
    operator = operator_create(slug="edgeco", name="Edge Agents", actor=SYSTEM, domains=[HOST])
    tenant, stub = stub_tenant(operator)
    Tenant.objects.filter(pk=tenant.pk).update(name="Initech Support")
    tenant.refresh_from_db()
    stub.tasks[TASK] = {"id": TASK, "kind": "demo", "status": "running", "blocked_reason": None,
                        "blocked_detail": None, "params": {"thread": "portal"}, "result": None,
                        "created_at": "2026-12-05T10:00:00Z", "updated_at": "2026-12-05T10:00:01Z"}
    member = User.objects.create_user("edge-admin", password=PASSWORD)
    OperatorMembership.objects.create(user=member, operator=operator, role="admin")
    staff = User.objects.create_user("edge-staff", password=PASSWORD, is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
    try:
        yield tenant, stub
    finally:
        stub.stop()


def _sign_in(page, url: str, username: str) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(url)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_the_model_prices_page_and_a_refused_price_at_both_widths(page, live_port, edges):
    tenant, _stub = edges
    ModelPrice.objects.create(operator=tenant.operator, model="gpt-4o-mini", input_usd_per_mtok=Decimal("0.12"),
                              output_usd_per_mtok=Decimal("0.48"))
    for model, price_in, price_out in (("gpt-4o-mini", "0.15", "0.60"), ("claude-sonnet-4-5", "3", "15")):
        ModelPrice.objects.create(operator=None, model=model, input_usd_per_mtok=Decimal(price_in),
                                  output_usd_per_mtok=Decimal(price_out))
    problems = collect_console_errors(page)
    _sign_in(page, f"http://{HOST}:{live_port}/prices/", "edge-admin")
    own = page.get_by_test_id("own-prices")
    expect(own.locator("tbody tr")).to_have_count(1)
    expect(own).to_contain_text("gpt-4o-mini")
    defaults = page.get_by_test_id("default-prices")
    expect(defaults.locator("tbody tr", has_text="gpt-4o-mini")).to_contain_text("your price applies")
    expect(defaults.locator("tbody tr", has_text="claude-sonnet-4-5")).to_contain_text("applies")
    for width in WIDTHS:
        at_width(page, width)
        # Readable at a phone's width: the list gets the whole width above the form, not a column of a few letters
        # beside it (at 390 px it was 78 px wide).
        assert page.locator("section", has=own).bounding_box()["width"] >= 300, width
        screenshot(page, f"portal-prices-{width}")

    page.set_viewport_size({"width": 1440, "height": 900})
    form = page.get_by_test_id("price-form")
    form.get_by_label("Model").fill("gpt 4o")
    form.get_by_label("Input (prompt) price").fill("-1")
    form.get_by_label("Output (completion) price").fill("0.6")
    # The browser's own checks would stop a negative number before the server sees it (min="0"): skip them, as a
    # script or an older browser would, so the server's message is what the page shows.
    form.evaluate("f => f.noValidate = true")
    form.get_by_role("button", name="Save price").click()
    expect(form.locator("#id_model_error")).to_contain_text("no spaces")
    expect(form.locator("#id_input_usd_per_mtok_error")).to_contain_text("greater than or equal to 0")
    expect(form.get_by_label("Model")).to_have_value("gpt 4o")  # the edit kept, beside its message
    assert ModelPrice.objects.filter(operator=tenant.operator).count() == 1
    for width in WIDTHS:
        at_width(page, width)
        form.scroll_into_view_if_needed()
        screenshot(page, f"portal-prices-refused-{width}")
    # The one console line is Chromium reporting the refused POST's status: a refused form answers 400 (as every
    # form of the portal does, tests/portal/test_portal_model_prices.py), which the browser logs as an error.
    refused = (f"Failed to load resource: the server responded with a status of 400 (Bad Request) "
               f"(http://{HOST}:{live_port}/prices/)")
    assert problems == [refused], problems


@pytest.mark.parametrize("where", ["dashboard", "portal"])
def test_the_cancel_confirm_page_at_both_widths(page, live_server, live_port, edges, where):
    tenant, stub = edges
    problems = collect_console_errors(page)
    if where == "dashboard":
        _sign_in(page, f"{live_server.url}/dashboard/tenants/{tenant.pk}/tasks/{TASK}/", "edge-staff")
    else:
        _sign_in(page, f"http://{HOST}:{live_port}/customers/{tenant.pk}/tasks/{TASK}/", "edge-admin")
    expect(page.get_by_test_id("task-status")).to_have_text("running")
    page.get_by_role("button", name="Cancel task").click()
    confirm = page.get_by_test_id("task-cancel-confirm")
    expect(confirm.get_by_role("heading")).to_have_text("Cancel this task?")
    expect(page.get_by_test_id("task-cancel-explain")).to_contain_text("it cannot be retried afterwards")
    expect(confirm.get_by_test_id("task-status")).to_have_text("running")
    expect(confirm.get_by_role("button", name="Cancel the task")).to_be_visible()
    expect(confirm.get_by_role("link", name="Keep it")).to_be_visible()
    for width in WIDTHS:
        at_width(page, width)
        screenshot(page, f"{where}-task-cancel-{width}")
    # Opening the page (and resizing it) asked only: the task still runs and nothing was audited.
    assert stub.tasks[TASK]["status"] == "running"
    assert not AuditLog.objects.filter(action="task.cancel", tenant=tenant).exists()
    assert problems == [], problems


def _selected_tabs(tabs) -> list[str]:
    """The tab links drawn as selected: with a visible border (the others' is transparent) and bold."""
    return tabs.locator("a").evaluate_all(
        "links => links.filter(a => { const s = getComputedStyle(a);"
        " return s.borderTopColor !== 'rgba(0, 0, 0, 0)' && Number(s.fontWeight) >= 600; })"
        ".map(a => a.textContent.trim())")


def test_the_tenant_page_tabs_at_both_widths(page, live_server, edges):
    tenant, _stub = edges
    detected = timezone.now() - timedelta(minutes=30)
    RecoveryEvent.objects.create(tenant=tenant, instance=AgentInstance.objects.get(tenant=tenant), reason="dead",
                                 detected_at=detected, resumed_at=detected + timedelta(seconds=6.2),
                                 outcome=RecoveryOutcome.SUCCEEDED)
    problems = collect_console_errors(page)
    _sign_in(page, f"{live_server.url}/dashboard/tenants/{tenant.pk}/", "edge-staff")
    icon = page.locator("link[rel~=icon]").first.get_attribute("href")
    answer = page.request.get(f"{live_server.url}{icon}")
    assert answer.ok and answer.headers["content-type"].startswith("image/"), (icon, answer.status)
    tabs = page.get_by_test_id("tenant-tabs")
    assert _selected_tabs(tabs) == ["Overview"]  # no fragment: the first panel, and its tab
    for width in WIDTHS:
        at_width(page, width)
        for tab, name in TABS.items():
            tabs.get_by_role("link", name=name).click()
            expect(page.get_by_test_id(f"tab-{tab}")).to_be_visible()
            for other in TABS.keys() - {tab}:
                expect(page.get_by_test_id(f"tab-{other}")).to_be_hidden()
            # The shown panel's tab looks selected (a border and bold, by CSS alone); the others do not.
            assert _selected_tabs(tabs) == [name], (width, tab)
            at_width(page, width)  # again: each panel is a different page's width
            page.evaluate("window.scrollTo(0, 0)")
            screenshot(page, f"dashboard-tenant-tab-{tab}-{width}", max_height=2500)
    expect(page.get_by_test_id("egress-card")).to_be_hidden()  # the last tab shown is activity
    assert problems == [], problems


def test_the_fleet_chart_of_a_new_install_at_both_widths(page, live_server, edges):
    """The sampler started 40 minutes ago: the 24 h chart's axis starts at its first sample, says so, and its
    first and last labels carry the date (the last one UTC)."""
    tenant, _stub = edges
    now = timezone.now()
    for minutes_ago in range(40, 0, -2):
        AgentInstance.objects.filter(tenant=tenant).update(
            status=InstanceStatus.RECOVERING if 20 <= minutes_ago < 26 else InstanceStatus.RUNNING,
            last_heartbeat_at=now - timedelta(minutes=minutes_ago, seconds=2))
        history_sample(now=now - timedelta(minutes=minutes_ago))
    problems = collect_console_errors(page)
    _sign_in(page, f"{live_server.url}/dashboard/fleet/?window=24h", "edge-staff")
    chart = page.locator('[data-testid="fleet-chart"] svg')
    expect(chart.locator("text.chart-caption")).to_contain_text("sampled since")
    labels = chart.locator("text.chart-label").all_text_contents()
    axis = [label for label in labels if label[:3].isalpha() and label[-5:].replace(":", "").isdigit()
            or label.endswith(" UTC")]
    assert axis and axis[-1].endswith(" UTC"), labels  # e.g. "Dec 5 20:03 UTC"
    expect(chart.locator("polygon.k-recovering")).to_have_count(1)
    scroller = page.get_by_test_id("fleet-chart").locator(".chart-scroll")
    dated_end = chart.locator("text.chart-label", has_text=" UTC")
    for width in WIDTHS:
        at_width(page, width)
        # Readable at a phone's width: not scaled below 600 px (its labels would be 5 px); its card scrolls
        # instead, and scrolled to its end the dated last label is on screen.
        assert chart.bounding_box()["width"] >= 600, width
        scroller.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
        end = dated_end.bounding_box()
        assert end is not None and 0 <= end["x"] and end["x"] + end["width"] <= width, (width, end)
        scroller.evaluate("e => { e.scrollLeft = 0; }")
        screenshot(page, f"dashboard-fleet-{width}", max_height=2500)
    assert problems == [], problems


def test_a_suspended_customers_status_card_at_both_widths(page, live_port, edges):
    """Suspended after a recovery: the card says the agent is stopped, not "Recover: 4 of 4 steps done"."""
    tenant, _stub = edges
    run = WorkflowRun.objects.create(tenant=tenant, kind=WorkflowKind.RECOVER, status=WorkflowStatus.SUCCEEDED)
    for position, name in enumerate(("detect", "stop", "start", "verify")):
        WorkflowStep.objects.create(run=run, name=name, position=position, status=StepStatus.DONE)
    Tenant.objects.filter(pk=tenant.pk).update(status="suspended")
    AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.STOPPED)
    problems = collect_console_errors(page)
    _sign_in(page, f"http://{HOST}:{live_port}/customers/{tenant.pk}/", "edge-admin")
    expect(page.get_by_test_id("customer-status")).to_have_text("suspended")
    expect(page.get_by_text("The agent is stopped")).to_be_visible()
    expect(page.get_by_text("4 of 4 steps done")).to_have_count(0)
    for width in WIDTHS:
        at_width(page, width)
        screenshot(page, f"portal-customer-suspended-{width}", max_height=1600)
    assert problems == [], problems
