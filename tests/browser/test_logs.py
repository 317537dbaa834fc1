"""The log screen's follow mode in headless Chromium: htmx polls for the records after the newest shown and puts
them on top, with no script of ours and no CSP violation; at 390 px the page does not scroll sideways. Then the
task the new record links to, blocked: its reason in words, and its Cancel button posted by the browser (CSRF).

The instance is the protocol stub (tests/instance_stub.py): what is under test is the page's polling and
swapping, not the agent-host's log (tests/runtime covers ``GET /v1/logs``).
"""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

from instances.blocked_reasons import BLOCKED_REASONS
from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create

from ..conversation_helpers import stub_tenant
from .conftest import WIDTHS, at_width, collect_console_errors, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-logs.localhost"
TASK = "6f1c9a62-0000-4000-8000-0000000000b7"


def test_following_the_log_puts_new_records_on_top_and_its_blocked_task_is_cancelled(page, live_port):
    operator = operator_create(slug="logco", name="Logco Agents", actor=SYSTEM, domains=[HOST])
    tenant, stub = stub_tenant(operator)
    now = time.time()
    stub.log_records = [{"ts": now - 10 + i, "level": "info", "logger": "agent.host", "msg": f"boot record {i}"}
                        for i in range(3)]
    user = User.objects.create_user("lou", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="member")
    problems = collect_console_errors(page)
    try:
        page.goto(f"http://{HOST}:{live_port}/customers/{tenant.pk}/logs/")
        page.get_by_label("Username").fill("lou")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        rows = page.get_by_test_id("log-record")
        expect(rows.first).to_contain_text("boot record 2")  # newest first
        page.get_by_label("Follow").check()
        page.get_by_role("button", name="Show").click()
        expect(page).to_have_url(re.compile(r"follow=1"))
        stub.log_records.append({"ts": now + 1, "level": "warning", "logger": "agent.host", "msg": "task blocked",
                                 "event": "task_blocked", "task_id": TASK})
        expect(rows.first).to_contain_text("task blocked", timeout=10_000)  # polled every 3 s
        expect(rows).to_have_count(4)
        link = rows.first.get_by_test_id("log-task")
        expect(link).to_have_attribute("href", f"/customers/{tenant.pk}/tasks/{TASK}/")
        stub.log_records.append({"ts": now + 2, "level": "info", "logger": "agent.host", "msg": "second wave"})
        expect(rows.first).to_contain_text("second wave", timeout=10_000)  # the next poll row carried on
        expect(rows).to_have_count(5)
        for width in WIDTHS:
            at_width(page, width)
            screenshot(page, "portal-logs-follow" if width == 1440 else f"portal-logs-{width}")

        stub.tasks[TASK] = {"id": TASK, "kind": "demo", "status": "blocked", "blocked_reason": "credential_unavailable",
                            "blocked_detail": "credential 'stripe' unavailable: control plane said 404",
                            "created_at": "2026-12-05T10:00:00Z", "updated_at": "2026-12-05T10:00:01Z"}
        page.set_viewport_size({"width": 1440, "height": 900})
        page.get_by_test_id("log-task").click()  # the record that names the task, now second
        expect(page.get_by_test_id("blocked-reason-text")).to_have_text(BLOCKED_REASONS["credential_unavailable"].text)
        expect(page.get_by_test_id("blocked-action")).to_be_visible()
        expect(page.get_by_role("button", name="Retry")).to_be_visible()
        screenshot(page, "portal-task-blocked")
        page.get_by_role("button", name="Cancel task").click()
        expect(page.get_by_test_id("task-cancel-confirm")).to_contain_text("cannot be retried afterwards")
        assert stub.tasks[TASK]["status"] == "blocked"  # the first click only asks
        page.get_by_role("button", name="Cancel the task").click()
        expect(page.get_by_role("status")).to_contain_text("Cancelled")
        expect(page.get_by_test_id("task-status")).to_have_text("cancelled")
        assert stub.tasks[TASK]["status"] == "cancelled"
        assert AuditLog.objects.filter(action="task.cancel", tenant=tenant, actor_id=str(user.pk)).count() == 1
        assert problems == []
    finally:
        stub.stop()


def test_the_dashboards_log_of_a_customer_at_both_widths(page, live_server, processes_alive):
    operator = operator_create(slug="logco-staff", name="Logco Agents", actor=SYSTEM)
    tenant, stub = stub_tenant(operator)
    Tenant.objects.filter(pk=tenant.pk).update(name="Globex Corporation")
    now = time.time()
    stub.log_records = [
        {"ts": now - 60, "level": "info", "logger": "agent.host", "msg": "agent-host listening", "event": "started"},
        {"ts": now - 50, "level": "info", "logger": "agent.runtime", "msg": "task started", "event": "task_started",
         "task_id": TASK},
        {"ts": now - 40, "level": "warning", "logger": "agent.tools", "msg": "lookup_order answered slowly (2.1 s)",
         "task_id": TASK},
        {"ts": now - 30, "level": "error", "logger": "agent.effects", "msg": "smtp refused: 451 try again later",
         "event": "effect_failed", "task_id": TASK},
        {"ts": now - 20, "level": "info", "logger": "agent.runtime", "msg": "task done", "event": "task_done",
         "task_id": TASK},
    ]
    staff = User.objects.create_user("logs-staff", password=PASSWORD, is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
    problems = collect_console_errors(page)
    try:
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(f"{live_server.url}/dashboard/tenants/{tenant.pk}/logs/")
        page.get_by_label("Username").fill("logs-staff")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        rows = page.get_by_test_id("log-record")
        expect(rows).to_have_count(5)
        expect(rows.first).to_contain_text("task done")  # newest first
        expect(rows.first.get_by_test_id("log-task")).to_have_attribute(
            "href", f"/dashboard/tenants/{tenant.pk}/tasks/{TASK}/")
        for width in WIDTHS:
            at_width(page, width)
            screenshot(page, f"dashboard-logs-{width}")
        page.get_by_role("searchbox", name="Search").fill("smtp")
        page.get_by_role("button", name="Show").click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("451 try again later")
        at_width(page, 390)
        assert problems == [], problems
    finally:
        stub.stop()
