"""End to end in headless Chromium against Django's live server and a real Celery worker.

Staff: sign in, open a tenant, retry its failed step, watch it reach ready.
Operator: sign in on its own host name, onboard a customer and watch it reach ready, change the
branding and see the live preview, then the published theme rolled out to the customer's agent.
Screenshots of the main pages land in docs/screenshots/.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

from branding.models import BrandingDeployment, RolloutJob
from branding.selectors import current_theme
from portal.models import OperatorMembership
from provisioning.choices import StepStatus, WorkflowStatus
from provisioning.models import WorkflowRun
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create

from ..conftest import wait_for
from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"


def _failed_tenant(operator, slug: str, name: str) -> Tenant:
    """A tenant whose onboarding failed at its first step (as after five failed attempts)."""
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=name, actor=SYSTEM)
    run = WorkflowRun.objects.get(tenant=tenant)
    WorkflowRun.objects.filter(pk=run.pk).update(status=WorkflowStatus.FAILED,
                                                 error="step database failed: ProvisioningError: connection refused")
    run.steps.filter(name="database").update(status=StepStatus.FAILED, attempts=5,
                                             error="ProvisioningError: connection refused")
    Tenant.objects.filter(pk=tenant.pk).update(status="failed", status_reason="step database failed")
    return tenant


def test_staff_signs_in_opens_a_tenant_and_retries_its_failed_step(page, live_server, worker_factory):
    operator = operator_create(slug="northwind", name="Northwind Resellers", actor=SYSTEM)
    tenant_onboard(allow_no_release=True, operator=operator, slug="contoso", name="Contoso Ltd", actor=SYSTEM)
    tenant = _failed_tenant(operator, "fabrikam", "Fabrikam Inc")
    staff = User.objects.create_user("oncall", password=PASSWORD, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="retry_workflow"))
    worker_factory(PROVISIONING_RUNTIME_DRIVER="deferred")
    # Let the healthy tenant finish first so the overview shows both outcomes.
    wait_for(lambda: Tenant.objects.get(slug="contoso").status == "ready", timeout=90, what="contoso ready")

    page.goto(f"{live_server.url}/dashboard/")
    expect(page).to_have_url(re.compile(r"/dashboard/login/"))
    screenshot(page, "dashboard-login")
    page.get_by_label("Username").fill("oncall")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_test_id("recoveries-24h")).to_contain_text("recoveries in the last 24 h")
    screenshot(page, "dashboard-overview")

    page.get_by_role("navigation", name="Dashboard").get_by_role("link", name="Tenants").click()
    page.get_by_label("Search").fill("fabrikam")
    page.get_by_role("button", name="Filter").click()
    screenshot(page, "dashboard-tenants")
    page.get_by_role("link", name="fabrikam").click()
    expect(page.get_by_test_id("tenant-status")).to_have_text("failed")
    expect(page.get_by_text("ProvisioningError: connection refused").first).to_be_visible()
    screenshot(page, "dashboard-tenant-failed")

    page.get_by_role("link", name="Retry failed step").click()
    expect(page.get_by_role("heading", name="Retry the failed step?")).to_be_visible()
    screenshot(page, "dashboard-confirm-retry")
    page.get_by_role("button", name="Yes, retry").click()
    expect(page.get_by_role("status")).to_contain_text("queued again from its failed step")
    # The live part refreshes by itself (HTMX polling) until the real worker has finished.
    expect(page.get_by_test_id("tenant-status")).to_have_text("ready", timeout=90_000)
    expect(page.locator(".timeline li.done")).to_have_count(6)
    screenshot(page, "dashboard-tenant-ready")
    assert Tenant.objects.get(pk=tenant.pk).status == "ready"


def test_operator_onboards_on_its_own_host_and_rebrands(page, live_port, worker_factory):
    operator = operator_create(slug="alpha", name="Alpha Agents", actor=SYSTEM, domains=["portal-a.localhost"])
    operator.support_email = "help@alpha.example"
    operator.save()
    other = operator_create(slug="beta", name="Beta Bots", actor=SYSTEM, domains=["portal-b.localhost"])
    tenant_onboard(operator=other, slug="beta-secret-customer", name="Beta Secret Customer",
                   actor=SYSTEM, allow_no_release=True)
    user = User.objects.create_user("ada", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")
    worker_factory(PROVISIONING_RUNTIME_DRIVER="deferred")
    base = f"http://portal-a.localhost:{live_port}"

    page.goto(f"{base}/")
    expect(page).to_have_url(re.compile(r"/login/"))
    expect(page.get_by_test_id("product-name")).to_have_text("Alpha Agents")
    expect(page.get_by_role("contentinfo")).to_contain_text("help@alpha.example")
    screenshot(page, "portal-login")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Customers", exact=True)).to_be_visible()
    expect(page.get_by_text("Beta Secret Customer")).to_have_count(0)
    page.keyboard.press("Tab")  # the first stop is the skip link, visible when focused
    assert page.evaluate("document.activeElement.textContent") == "Skip to main content"
    expect(page.get_by_role("link", name="Skip to main content")).to_be_in_viewport()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"

    page.get_by_label("Customer name").fill("Globex Corporation")
    page.get_by_label("Short name (slug)").fill("globex")
    page.get_by_label("Onboard without a release").check()  # this operator has no default release
    page.get_by_role("button", name="Onboard").click()
    expect(page.get_by_role("heading", name="Globex Corporation")).to_be_visible()
    expect(page.get_by_test_id("customer-status")).to_have_text("ready", timeout=90_000)
    expect(page.locator("label[for=prov-progress]")).to_contain_text("6 of 6 steps done")
    screenshot(page, "portal-customer-ready")
    tenant = Tenant.objects.get(operator=operator, slug="globex")
    onboard_hash = BrandingDeployment.objects.get(tenant=tenant).content_hash  # branded at onboarding
    assert onboard_hash

    page.get_by_role("navigation", name="Portal").get_by_role("link", name="Customers").click()
    screenshot(page, "portal-customers")

    page.get_by_role("navigation", name="Portal").get_by_role("link", name="Branding").click()
    page.get_by_label("Product name").fill("Alpha <b>Cloud</b>")
    # Each colour is followed by a `change` (what leaving the field sends): the form previews on `input` after
    # 300 ms and on `change`, and under a loaded CI machine the first fill's preview could still be in flight when
    # the second came; the explicit change asks for the preview of what the form holds now, whatever came before.
    primary = page.get_by_label("Primary colour", exact=True)
    primary.fill("#d2d2d2")
    primary.dispatch_event("change")
    expect(page.get_by_test_id("contrast")).to_contain_text("below WCAG AA", timeout=30_000)
    expect(page.get_by_test_id("preview-errors")).to_contain_text("1.5:1")
    primary.fill("#7a1f5c")
    primary.dispatch_event("change")
    expect(page.get_by_test_id("contrast")).to_contain_text("passes WCAG AA", timeout=30_000)
    expect(page.get_by_test_id("preview-name")).to_have_text("Alpha Cloud")
    screenshot(page, "portal-branding-preview")

    page.get_by_role("button", name="Check and publish").click()
    expect(page.get_by_test_id("revision-status")).to_have_text("published", timeout=60_000)
    expect(page.get_by_test_id("rollout-status")).to_have_text("succeeded", timeout=60_000)
    expect(page.get_by_test_id("revision-warnings")).to_contain_text("HTML was removed from the product name")
    page.reload()
    expect(page.get_by_test_id("product-name")).to_have_text("Alpha Cloud")
    bar = page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor")
    assert bar == "rgb(122, 31, 92)"
    screenshot(page, "portal-branding-published")

    theme = current_theme(operator)
    job = RolloutJob.objects.get(theme=theme)
    assert (job.status, job.done, job.total) == ("succeeded", 1, 1)
    deployment = BrandingDeployment.objects.get(tenant=tenant)
    assert deployment.content_hash == theme.content_hash != onboard_hash

    # Another operator's host shows its own brand, and none of Alpha's data even when signed in there.
    page.goto(f"http://portal-b.localhost:{live_port}/customers/{tenant.pk}/")
    expect(page).to_have_url(re.compile(r"portal-b\.localhost.*/login/"))
    expect(page.get_by_test_id("product-name")).to_have_text("Beta Bots")
    page.goto(f"http://portal-b.localhost:{live_port}/login/")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("correct username and password")

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/customers/{tenant.pk}/")
    expect(page.get_by_test_id("customer-status")).to_have_text("ready")
    screenshot(page, "portal-customer-mobile")
