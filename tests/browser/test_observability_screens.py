"""Issue 37's screens in headless Chromium at 1440 px and at 390 px: the portal's customer page, a task's trace view
(waterfall, span details, cost per model call) on the dashboard and in the portal, and the dashboard's usage of
the fleet and of one customer. At each width the page does not scroll sideways and logs no console error.

The instance is the protocol stub (tests/instance_stub.py) serving a task's spans as ``GET /v1/tasks/{id}`` does:
what is under test is how the pages draw them (tests/conversations/test_traces.py runs a real agent-host and its
export).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from playwright.sync_api import expect

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from usage.models import ModelPrice, UsageDay
from vault.services import credential_put

from ..conversation_helpers import stub_tenant
from .conftest import WIDTHS, at_width, collect_console_errors, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-obs.localhost"
TASK = "3d5e7f90-0000-4000-8000-0000000037aa"
MODEL = "gpt-4o-mini"


def _span(n: int, name: str, parent: int | None, at_ms: int, duration_ms: float, **attributes: object) -> dict:
    start = datetime(2026, 12, 5, 10, 0, tzinfo=UTC) + timedelta(milliseconds=at_ms)
    return {"trace_id": "5e" * 16, "span_id": f"{n:016x}", "parent_span_id": f"{parent:016x}" if parent else None,
            "name": name, "kind": "internal", "status": "ok", "started_at": start.isoformat(),
            "duration_ms": duration_ms, "attributes": attributes}


def _chat(n: int, at_ms: int, tokens_in: int, tokens_out: int, answer: str) -> dict:
    return _span(n, f"chat {MODEL}", 3, at_ms, 900.0, **{
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": MODEL,
        "gen_ai.response.model": MODEL, "gen_ai.usage.input_tokens": tokens_in,
        "gen_ai.usage.output_tokens": tokens_out,
        "gen_ai.input.messages": '[{"role": "user", "content": "Where is my order 1042?"}]',
        "gen_ai.output.messages": f'[{{"role": "assistant", "content": "{answer}"}}]'})


SPANS = [
    _span(1, "invoke_agent support", None, 0, 2950.0, **{
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support", "agent.task_id": TASK,
        "agent.outcome": "done", "gen_ai.conversation.id": "portal"}),
    _span(2, "step remember", 1, 5, 40.0, **{"agent.checkpoint_id": 41, "agent.step.output": '{"remembered": 3}'}),
    _span(3, "step answer", 1, 60, 2700.0, **{"agent.checkpoint_id": 42}),
    _chat(4, 70, 812, 64, "Let me look that order up."),
    _span(5, "execute_tool lookup_order", 3, 980, 120.0, **{
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order", "agent.tool.cached": False,
        "gen_ai.tool.call.arguments": '{"order_id": "1042"}',
        "gen_ai.tool.call.result": '{"status": "shipped", "carrier": "DHL"}'}),
    _chat(6, 1110, 951, 118, "Order 1042 has shipped with DHL."),
    _span(7, "effect ticket", 3, 2050, 610.0, **{
        "agent.effect.name": "ticket", "agent.effect.idempotency_key": f"{TASK}:answer:ticket:0",
        "agent.effect.outcome": "performed", "agent.effect.arguments": '{"to": "help@tenant.test"}'}),
    _span(8, "step reply", 1, 2780, 150.0, **{"agent.checkpoint_id": 43}),
]


@pytest.fixture
def observed(processes_alive):
    """An operator with its portal host, a member and a staff user, and a ready customer whose stub instance has
    a finished task with the spans above, a few tasks and log records, and this month's usage collected."""
    operator = operator_create(slug="obsco", name="Observa Agents", actor=SYSTEM, domains=[HOST])
    tenant, stub = stub_tenant(operator)
    Tenant.objects.filter(pk=tenant.pk).update(name="Globex Corporation")
    tenant.refresh_from_db()
    credential_put(tenant=tenant, name="crm-api-key-for-the-support-desk", value="never-shown", actor=SYSTEM)
    ModelPrice.objects.create(operator=None, model=MODEL, input_usd_per_mtok=Decimal("0.15"),
                              output_usd_per_mtok=Decimal("0.60"))
    stub.tasks[TASK] = {"id": TASK, "kind": "demo", "status": "done", "blocked_reason": None, "blocked_detail": None,
                        "params": {"thread": "portal"}, "result": {"reply": "Order 1042 has shipped with DHL."},
                        "created_at": "2026-12-05T10:00:00Z", "updated_at": "2026-12-05T10:00:03Z"}
    stub.spans[TASK] = SPANS
    stub.threads["portal"] = [
        {"seq": 1, "thread": "portal", "role": "user", "content": "Where is my order 1042?", "message_id": TASK,
         "task": TASK, "created_at": "2026-12-05T10:00:00Z"},
        {"seq": 2, "thread": "portal", "role": "assistant", "content": "Order 1042 has shipped with DHL.",
         "message_id": None, "task": TASK, "created_at": "2026-12-05T10:00:03Z"}]
    stub.steps[TASK] = [{"name": name, "status": "done", "attempts": 1, "started_at": f"2026-12-05T10:00:0{at}Z",
                         "finished_at": f"2026-12-05T10:00:0{at + 1}Z", "duration_ms": ms, "error": None}
                        for name, at, ms in (("remember", 0, 40), ("answer", 0, 2700), ("reply", 2, 150))]
    key = stub.add_effect(TASK, state="committed")
    stub.effects[key].update(step="answer", effect="ticket", result={"message_id": "<ticket-1042@tenant.test>"},
                             settled_at="2026-12-05T10:00:02Z")
    today = timezone.now().date()
    for back in range(min(today.day, 6)):  # this month's days so far, at most six
        day = today - timedelta(days=back)
        UsageDay.objects.create(
            tenant=tenant, day=day, tasks_submitted=12 + back, tasks_done=11 + back, tasks_failed=1, steps_run=40,
            compute_s=95.5 + back, messages_in=9, messages_out=9, effects_committed=3,
            input_tokens=18_000 + 900 * back, output_tokens=2_400 + 50 * back,
            tokens_by_model={MODEL: {"input": 18_000 + 900 * back, "output": 2_400 + 50 * back}},
            schema_bytes=3_500_000, object_bytes=12_000_000, volume_bytes=48_000_000, collected_at=timezone.now())
    member = User.objects.create_user("obs-member", password=PASSWORD)
    OperatorMembership.objects.create(user=member, operator=operator, role="admin")
    staff = User.objects.create_user("obs-staff", password=PASSWORD, is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
    try:
        yield tenant, stub
    finally:
        stub.stop()


def _sign_in(page, url: str, username: str) -> None:
    page.goto(url)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_the_customer_page_at_both_widths(page, live_port, observed):
    tenant, _stub = observed
    problems = collect_console_errors(page)
    page.set_viewport_size({"width": 1440, "height": 900})
    _sign_in(page, f"http://{HOST}:{live_port}/customers/{tenant.pk}/", "obs-member")
    expect(page.get_by_test_id("customer-status")).to_have_text("ready")
    expect(page.get_by_text("Model tokens").first).to_be_visible()
    expect(page.get_by_text("Order 1042 has shipped with DHL.")).to_be_visible()  # the chat, loaded by htmx
    for width in WIDTHS:
        at_width(page, width)
        # Revoke is on screen at each width, without scrolling its table sideways (it was a last column, issue 37).
        revoke = page.get_by_test_id("credential-revoke")
        # Scroll the page only (scroll_into_view would also scroll the table's card sideways and hide the fault).
        revoke.evaluate("el => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - 100)")
        box = revoke.bounding_box()
        assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= width, (width, box)
        # At 1440 px down to the chat: the forms below it would take the picture over 400 KB.
        screenshot(page, f"portal-customer-{width}", max_height=2500 if width == 1440 else None)
    assert problems == [], problems


@pytest.mark.parametrize("where", ["dashboard", "portal"])
def test_the_trace_view_at_both_widths(page, live_server, live_port, observed, where):
    tenant, _stub = observed
    problems = collect_console_errors(page)
    page.set_viewport_size({"width": 1440, "height": 900})
    if where == "dashboard":
        _sign_in(page, f"{live_server.url}/dashboard/tenants/{tenant.pk}/tasks/{TASK}/", "obs-staff")
    else:
        _sign_in(page, f"http://{HOST}:{live_port}/customers/{tenant.pk}/tasks/{TASK}/", "obs-member")
    trace = page.get_by_test_id("task-trace")
    expect(trace.locator("g.span-row")).to_have_count(len(SPANS))
    # 812 + 951 in at $0.15/M and 64 + 118 out at $0.60/M: 0.00026445 + 0.0001092
    expect(page.get_by_test_id("trace-cost")).to_contain_text("$0.00037365 for 2 model calls")
    expect(page.get_by_test_id("span-cost")).to_have_text(["$0.0001602", "$0.00021345"])
    details = page.get_by_test_id("trace-spans").locator("details")
    details.filter(has_text="execute_tool lookup_order").locator("summary").click()
    expect(page.get_by_text('"carrier": "DHL"')).to_be_visible()
    details.filter(has_text="chat").nth(1).locator("summary").click()
    expect(page.get_by_text("Order 1042 has shipped with DHL.").first).to_be_visible()
    expect(page.get_by_test_id("task-steps")).to_contain_text("answer")
    for width in WIDTHS:
        at_width(page, width)
        # Readable at a phone's width too: the waterfall is not squeezed below 600 px (its card scrolls instead).
        assert trace.locator("svg").bounding_box()["width"] >= 600
        screenshot(page, f"{where}-trace-{width}")
    assert problems == [], problems


def test_the_usage_screens_at_both_widths(page, live_server, observed):
    tenant, _stub = observed
    problems = collect_console_errors(page)
    page.set_viewport_size({"width": 1440, "height": 900})
    _sign_in(page, f"{live_server.url}/dashboard/usage/", "obs-staff")
    expect(page.locator("svg.chart")).to_be_visible()
    expect(page.get_by_role("link", name=tenant.slug)).to_be_visible()
    for width in WIDTHS:
        at_width(page, width)
        screenshot(page, "dashboard-usage" if width == 1440 else "dashboard-usage-390")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{live_server.url}/dashboard/tenants/{tenant.pk}/usage/")
    expect(page.locator("svg.chart")).to_be_visible()
    expect(page.get_by_text(f"{timezone.now().date():%Y-%m-%d}").first).to_be_visible()
    for width in WIDTHS:
        at_width(page, width)
        screenshot(page, "dashboard-usage-customer" if width == 1440 else "dashboard-usage-customer-390")
    assert problems == [], problems
