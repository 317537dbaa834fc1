"""The API's own pages in headless Chromium: Swagger UI over the live schema, and a problem type's page.

Swagger UI is self-hosted (drf-spectacular-sidecar) under the strict CSP: it must render every resource tag
and an operation's documented errors with nothing blocked; a problem ``type`` link must lead to a page that
says what the problem means and what to do.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_swagger_ui_renders_every_resource_and_an_operations_errors(page, live_server):
    blocked: list[str] = []
    page.on("console", lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.goto(f"{live_server.url}/api/docs/")
    expect(page.locator(".information-container .title")).to_contain_text("Agent control plane API")
    tags = page.locator(".opblock-tag-section h3 .opblock-tag, .opblock-tag-section h3 a span")
    expect(tags.first).to_be_visible()
    shown = {t.strip().lower() for t in page.locator(".opblock-tag-section h3").all_inner_texts()}
    for tag in ("tenants", "conversations", "tasks", "events", "webhooks"):
        assert any(name.startswith(tag) for name in shown), (tag, shown)
    screenshot(page, "api-swagger-ui", full_page=False)
    operation = page.locator(".opblock-post", has_text="/api/v1/tenants/{tenant_id}/suspend").first
    operation.locator(".opblock-summary").click()
    responses = operation.locator(".responses-table")
    expect(responses).to_contain_text("409")
    expect(responses).to_contain_text("problem+json")
    screenshot(page, "api-swagger-operation", full_page=False)
    assert blocked == []


def test_a_problem_type_link_leads_to_its_page(page, live_server):
    page.goto(f"{live_server.url}/problems/tenant-suspended")
    expect(page.locator("h1")).to_contain_text("Tenant suspended")
    expect(page.locator("main")).to_contain_text("resume")
    screenshot(page, "api-problem-page", full_page=False)
    page.goto(f"{live_server.url}/problems/")
    expect(page.locator("main")).to_contain_text("idempotency-key-reused")
