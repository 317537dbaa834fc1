"""An operator suspends, resumes and deprovisions a customer from the portal, in headless Chromium.

The customer is onboarded by a real Celery worker onto a real local agent-host (the conversational test
agent). Suspend and resume are confirmed on their own page, committed by the request, and carried out by
the worker (the process is stopped, then started again); the page follows. Deprovisioning refuses until the
customer's slug is typed, then the worker archives and removes everything. None of it is a recovery.
Branding: once the job has published, the page shows the published values without a manual reload; a
refused submission keeps the operator's edits.
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from portal.models import OperatorMembership
from provisioning.drivers.local_process import live_host_pid
from provisioning.models import AgentInstance, RecoveryEvent
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create

from ..conftest import kill_session_instances, wait_for
from ..conversation_helpers import CHAT_HOLD_NAME, chat_release
from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-actions.localhost"
# As tests/browser/test_chat.py: a real agent in the instance (no commas or '=' in the JSON).
EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_CONFIG": json.dumps({"chat_hold_file": CHAT_HOLD_NAME})}


@pytest.fixture
def fleet(worker_factory, settings):  # type: ignore[no-untyped-def]
    settings.INSTANCE_EXTRA_ENV = dict(EXTRA_ENV)
    chat_release()
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in EXTRA_ENV.items()),
                            RUNTIME_STOP_GRACE_S="5")
    yield worker
    kill_session_instances()


def _pid(tenant: Tenant) -> int | None:
    return live_host_pid(tenant_spec(Tenant.objects.get(pk=tenant.pk)))


def test_operator_suspends_resumes_and_deprovisions_a_customer(page, live_port, fleet):
    operator = operator_create(slug="actco", name="Actco Agents", actor=SYSTEM, domains=[HOST])
    tenant, _ = tenant_onboard(operator=operator, slug="umbrella", name="Umbrella Corp",
                               actor=SYSTEM, allow_no_release=True)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", (tenant.status_reason, fleet.log()[-2000:])
    first_pid = wait_for(lambda: _pid(tenant), timeout=60, what="a live agent-host")
    user = User.objects.create_user("olga", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")

    page.goto(f"http://{HOST}:{live_port}/customers/{tenant.pk}/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Umbrella Corp")).to_be_visible()
    expect(page.get_by_test_id("customer-status")).to_have_text("ready")
    actions = page.get_by_test_id("customer-actions")
    expect(actions.get_by_role("link", name="Resume")).to_have_count(0)

    # Suspend: a confirmation page, then the POST; the worker stops the process.
    actions.get_by_role("link", name="Suspend").click()
    expect(page.get_by_role("heading", name="Suspend Umbrella Corp?")).to_be_visible()
    page.get_by_label("Reason (optional)").fill("invoice overdue")
    screenshot(page, "portal-confirm-suspend")
    page.get_by_role("button", name="Yes, suspend").click()
    expect(page.get_by_role("status")).to_contain_text("is suspended")
    expect(page.get_by_test_id("customer-status")).to_have_text("suspended")
    expect(page.get_by_test_id("instance-health")).to_have_text("stopped")
    wait_for(lambda: _pid(tenant) is None, timeout=60, what="the agent-host stopped by the worker")
    assert Tenant.objects.get(pk=tenant.pk).status_reason == "invoice overdue"

    # Resume: the worker starts it again; the live part follows until it is healthy.
    page.get_by_test_id("customer-actions").get_by_role("link", name="Resume").click()
    expect(page.get_by_role("heading", name="Resume Umbrella Corp?")).to_be_visible()
    page.get_by_role("button", name="Yes, resume").click()
    expect(page.get_by_test_id("customer-status")).to_have_text("ready")
    expect(page.get_by_test_id("instance-health")).to_have_text("healthy", timeout=60_000)
    second_pid = wait_for(lambda: _pid(tenant), timeout=60, what="the agent-host started again")
    assert second_pid != first_pid
    screenshot(page, "portal-customer-resumed")
    # Planned: not one recovery recorded, and the audit names the portal user.
    assert not RecoveryEvent.objects.filter(tenant=tenant).exists()
    expect(page.get_by_test_id("no-recoveries")).to_be_visible()
    labels = set(AuditLog.objects.filter(tenant=tenant, action="tenant.transition").values_list("actor_label",
                                                                                                flat=True))
    assert "olga via actco portal" in labels

    # Deprovision: refused until the slug is typed exactly.
    page.get_by_test_id("customer-actions").get_by_role("link", name="Deprovision").click()
    expect(page.get_by_role("heading", name="Deprovision Umbrella Corp?")).to_be_visible()
    field = page.get_by_label("Type the customer's short name to confirm")
    field.fill("umbrela")
    page.get_by_role("button", name="Deprovision").click()
    expect(page.get_by_role("alert")).to_contain_text("nothing was deprovisioned")
    screenshot(page, "portal-confirm-deprovision")
    assert Tenant.objects.get(pk=tenant.pk).status == "ready"
    page.get_by_label("Type the customer's short name to confirm").fill("umbrella")
    page.get_by_role("button", name="Deprovision").click()
    expect(page.get_by_role("status")).to_contain_text("Deprovisioning Umbrella Corp")
    expect(page.get_by_test_id("customer-status")).to_have_text("deleted", timeout=120_000)
    assert _pid(tenant) is None
    assert not AgentInstance.objects.filter(tenant=tenant, status="running").exists()

    # Archived customers leave the default list (and stay findable under "archived").
    page.get_by_role("navigation", name="Portal").get_by_role("link", name="Customers").click()
    expect(page.get_by_role("link", name="Umbrella Corp")).to_have_count(0)
    page.get_by_label("Status").select_option("deleted")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("link", name="Umbrella Corp")).to_be_visible()
    assert re.search(r"status=deleted", page.url)


def test_branding_form_follows_the_job_and_keeps_refused_edits(page, live_port, worker_factory):
    operator = operator_create(slug="brandco", name="Brandco", actor=SYSTEM, domains=["portal-brand.localhost"])
    user = User.objects.create_user("bea", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")
    worker_factory(PROVISIONING_RUNTIME_DRIVER="deferred")
    page.goto(f"http://portal-brand.localhost:{live_port}/branding/")
    page.get_by_label("Username").fill("bea")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    page.get_by_label("Product name").fill("Gamma <i>Cloud</i>")
    page.get_by_label("Primary colour", exact=True).fill("#7a1f5c")
    page.get_by_role("button", name="Check and publish").click()
    # No reload by the test: once the job has published, the page reloads itself with the published values.
    expect(page.get_by_test_id("revision-status")).to_have_text("published", timeout=60_000)
    expect(page.get_by_test_id("product-name")).to_have_text("Gamma Cloud", timeout=10_000)
    expect(page.get_by_label("Product name")).to_have_value("Gamma Cloud")

    page.get_by_label("Product name").fill("Gamma Unreadable")
    page.get_by_label("Primary colour", exact=True).fill("#d2d2d2")
    page.get_by_role("button", name="Check and publish").click()
    expect(page.locator("#id_primary_color_error")).to_contain_text("4.5:1")
    expect(page.get_by_label("Product name")).to_have_value("Gamma Unreadable")
    expect(page.get_by_label("Primary colour", exact=True)).to_have_value("#d2d2d2")
    expect(page.get_by_test_id("product-name")).to_have_text("Gamma Cloud")  # nothing was published
