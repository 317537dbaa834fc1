"""An operator admin watches a release rollout in the portal, in headless Chromium with the strict CSP: the
page follows the rollout live (htmx, no reload), the Pause button pauses it, and the Releases page links to it.

The rollout's rows are written directly, as the workflow would write them (tests/releases/test_release_rollouts.py runs
real ones): this is about the page, and pausing queues nothing, so no worker is needed.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from portal.models import OperatorMembership
from releases.models import AgentRelease, Rollout, RolloutItem
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-rollouts.localhost"


def _release(operator, version: str) -> AgentRelease:  # type: ignore[no-untyped-def]
    return AgentRelease.objects.create(operator=operator, version=version, distribution="support-agent",
                                       digest="sha256:" + version.replace(".", "") * 20, filename="s.whl",
                                       size_bytes=1, artifact_key="x", kinds={"support": "answers tickets"})


def test_admin_watches_a_rollout_live_and_pauses_it(page, live_port):
    operator = operator_create(slug="rollco", name="Rollco", actor=SYSTEM, domains=[HOST])
    admin = User.objects.create_user("rhea", password=PASSWORD)
    OperatorMembership.objects.create(user=admin, operator=operator, role="admin")
    old, new = _release(operator, "1.4.0"), _release(operator, "1.5.0")
    tenants = [Tenant.objects.create(operator=operator, slug=s, name=s.title(), status="ready")
               for s in ("acme", "globex", "initech", "umbrella", "hooli")]
    rollout = Rollout.objects.create(operator=operator, release=new, canary=1, wave_size=2, soak_s=30,
                                     created_by="rhea via rollco portal")
    now = timezone.now()
    states = [("upgraded", 1, 840), ("upgraded", 1, 1210), ("upgrading", 1, None), ("pending", 0, None),
              ("pending", 0, None)]
    items = [RolloutItem.objects.create(rollout=rollout, tenant=t, wave=0 if i == 0 else 1 + (i - 1) // 2,
                                        status=status, from_release=old, upgrades=upgrades, downtime_ms=downtime,
                                        started_at=now if upgrades else None)
             for i, (t, (status, upgrades, downtime)) in enumerate(zip(tenants, states, strict=True))]
    blocked: list[str] = []
    page.on("console", lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None)

    page.goto(f"http://{HOST}:{live_port}/rollouts/{rollout.pk}/")
    page.get_by_label("Username").fill("rhea")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Rollout of 1.5.0")).to_be_visible()
    expect(page.get_by_test_id("rollout-status")).to_have_text("running")
    expect(page.get_by_test_id("count-upgraded")).to_have_text("2")
    expect(page.get_by_test_id("rollout-item")).to_have_count(5)

    # The workflow moves on; the page follows without a reload.
    RolloutItem.objects.filter(pk=items[2].pk).update(status="upgraded", downtime_ms=990)
    expect(page.get_by_test_id("count-upgraded")).to_have_text("3", timeout=10_000)
    expect(page.get_by_test_id("count-upgrading")).to_have_text("0")
    screenshot(page, "portal-rollout")

    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("status")).to_contain_text("Rollout paused")
    expect(page.get_by_test_id("rollout-status")).to_have_text("paused")
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    rollout.refresh_from_db()
    assert rollout.status == "paused" and "paused by rhea" in rollout.reason

    page.get_by_role("navigation", name="Portal").get_by_role("link", name="Releases").click()
    expect(page.get_by_test_id("release")).to_have_count(2)
    expect(page.get_by_test_id("active-rollout")).to_contain_text("1.5.0")
    expect(page.get_by_role("button", name="Upload and check")).to_be_visible()
    screenshot(page, "portal-releases")
    assert blocked == []
