"""Issue 37's rough edges, re-checked one by one: the items that had no test of their own (query counts at a
realistic size, the admin's plural, the onboarding URL's reload, a suspended customer's status card). Each test
fails against the code before its fix (docs/ui.md, "Rough edges from issue 37, re-checked")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from portal.models import OperatorMembership
from provisioning.choices import StepStatus, WorkflowKind, WorkflowStatus
from provisioning.models import WorkflowRun, WorkflowStep
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from webhooks.models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ROWS = 30  # a realistic page: with one query per row, every bound below is exceeded by far
HOST = "edges-a.localhost"


def _staff_client() -> Client:
    user = User.objects.create_superuser("edges-staff", password="correct horse battery staple")
    client = Client()
    client.force_login(user)
    return client


def _tenants(operator, n: int = ROWS) -> list[Tenant]:  # type: ignore[no-untyped-def]
    return [Tenant.objects.create(operator=operator, slug=f"edge-{i}", name=f"Edge {i}") for i in range(n)]


def test_dashboard_tenant_list_is_a_fixed_number_of_queries(operator, settings, django_assert_max_num_queries):
    settings.DASHBOARD_PAGE_SIZE = ROWS
    _tenants(operator)
    client = _staff_client()
    with django_assert_max_num_queries(10):  # 7; was 37, one more per tenant for its plan
        page = client.get("/dashboard/tenants/")
    assert page.status_code == 200 and page.content.decode().count('href="/dashboard/tenants/') >= ROWS


def test_admin_audit_log_is_a_fixed_number_of_queries(operator, django_assert_max_num_queries):
    for tenant in _tenants(operator):
        AuditLog.objects.create(actor_kind="system", actor_label="system", action="tenant.create",
                                operator=operator, tenant=tenant, target_type="tenant", target_id=str(tenant.pk))
    client = _staff_client()
    with django_assert_max_num_queries(10):  # 6; was 66: per row its tenant, then that tenant's operator
        page = client.get("/admin/tenants/auditlog/")
    assert page.status_code == 200 and f"{operator.slug}/edge-29" in page.content.decode()
    with django_assert_max_num_queries(10):
        assert client.get("/admin/tenants/tenant/").status_code == 200


def test_portal_webhook_log_is_a_fixed_number_of_queries(settings, django_assert_max_num_queries):
    settings.PORTAL_PAGE_SIZE = ROWS
    operator = operator_create(slug="edges-a", name="Edges", actor=SYSTEM, domains=[HOST])
    endpoint = WebhookEndpoint.objects.create(operator=operator, url="https://hooks.example.com/in",
                                              secret_kek_id="k", secret_blob=b"x")
    now = timezone.now()
    for i in range(ROWS):
        event = Event.objects.create(operator=operator, type="tenant.ready", data={"n": i})
        delivery = WebhookDelivery.objects.create(endpoint=endpoint, event=event, status="failed", attempts=2)
        for number in (1, 2):
            WebhookAttempt.objects.create(delivery=delivery, number=number, attempted_at=now, status_code=500,
                                          request_body='{"type": "tenant.ready"}', response_body="boom")
    user = User.objects.create_user("edges-admin")
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    with django_assert_max_num_queries(12):  # 9; 38 without the prefetch: one more per delivery
        page = client.get(f"/webhooks/{endpoint.pk}/")
    assert page.status_code == 200 and page.content.decode().count('data-testid="request-body"') == 2 * ROWS


def test_the_admin_says_webhook_deliveries():
    assert WebhookDelivery._meta.verbose_name_plural == "webhook deliveries"
    assert admin.site.is_registered(WebhookDelivery)


def test_reloading_a_refused_onboarding_goes_back_to_the_form_not_a_405():
    operator = operator_create(slug="edges-b", name="Edges B", actor=SYSTEM, domains=[HOST])
    user = User.objects.create_user("edges-member")
    membership = OperatorMembership.objects.create(user=user, operator=operator, role="member")
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    refused = client.post("/customers/", {"slug": "Not A Slug!", "name": ""})
    assert refused.status_code == 400  # the form with its errors, answered at /customers/
    reload = client.get("/customers/")
    assert reload.status_code == 302 and reload["Location"] == "/"
    assert client.get("/customers/", follow=True).status_code == 200
    membership.role = "viewer"
    membership.save()
    assert client.get("/customers/").status_code == 302  # a viewer's reload too
    assert client.post("/customers/", {"slug": "x", "name": "x"}).status_code == 403


def test_a_suspended_customer_card_does_not_show_its_last_finished_workflow():
    operator = operator_create(slug="edges-c", name="Edges C", actor=SYSTEM, domains=[HOST])
    tenant = Tenant.objects.create(operator=operator, slug="sleepy", name="Sleepy", status="suspended")
    run = WorkflowRun.objects.create(tenant=tenant, kind=WorkflowKind.RECOVER, status=WorkflowStatus.SUCCEEDED)
    for position, name in enumerate(("detect", "stop", "start", "verify")):
        WorkflowStep.objects.create(run=run, name=name, position=position, status=StepStatus.DONE)
    user = User.objects.create_user("edges-c-member")
    OperatorMembership.objects.create(user=user, operator=operator, role="member")
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    live = client.get(f"/customers/{tenant.pk}/live").content.decode()
    assert "4 of 4 steps done" not in live and 'id="prov-progress"' not in live
    assert "The agent is stopped" in live
    # The same run shows while it matters: a customer being recovered follows its steps.
    Tenant.objects.filter(pk=tenant.pk).update(status="recovering")
    assert "4 of 4 steps done" in client.get(f"/customers/{tenant.pk}/live").content.decode()


def _chart_texts(markup: str) -> list[str]:
    import xml.etree.ElementTree as ET

    return [t.text or "" for t in ET.fromstring(str(markup)).iter("{http://www.w3.org/2000/svg}text")]


def test_a_new_installs_first_hour_fills_the_24h_axis_and_the_axis_has_dates():
    from dashboard.charts import PAD, WIDTH, line_chart

    end = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    times = [end - timedelta(minutes=m) for m in (40, 20, 0)]  # a sampler that started 40 min ago
    markup = line_chart(times, [("healthy", [1.0, 2.0, 2.0])], start=end - timedelta(hours=24), end=end,
                        stacked=True, title="Instances by status, last 24h", chart_id="fleet")
    texts = _chart_texts(markup)
    assert "Instances by status, last 24h (max 2; sampled since Dec 5 17:20)" in texts
    assert texts[-3:] == ["Dec 5 17:20", "17:40", "Dec 5 18:00 UTC"]  # first and last ticks carry the date
    xs = [float(pt.split(",")[0]) for pt in str(markup).split('points="', 1)[1].split('"', 1)[0].split()]
    assert min(xs) == PAD and max(xs) == WIDTH - PAD  # the whole width, not the last 3 % of it
    # A window sampled from its start keeps it: a hole later on is a hole, not a shorter axis.
    full = line_chart([end - timedelta(hours=24), end], [("healthy", [1.0, 1.0])], start=end - timedelta(hours=24),
                      end=end, title="t", chart_id="full")
    assert "t (max 1)" in _chart_texts(full) and "Dec 4 18:00" in _chart_texts(full)


def test_the_recoveries_bar_labels_fit_their_bars():
    from dashboard.charts import LABEL_CHAR_W, MIN_SLOTS, PAD, WIDTH, bar_chart

    points = [(f"0{i}:15 customer-with-a-long-slug-{i} (Dec 5)", 10.0 + i) for i in range(10)]
    markup = str(bar_chart(points, title="Time to resume", unit=" s", chart_id="ttr"))
    labels = _chart_texts(markup)[1:]
    slot = (WIDTH - 2 * PAD) / MIN_SLOTS
    assert len(labels) == 10 and all(len(label) * LABEL_CHAR_W <= slot for label in labels)  # no overlap
    assert labels[0].startswith("00:15") and labels[0].endswith("…")
    assert f"{points[0][0]}: 10.0 s</title>" in markup  # the whole label in the bar's tooltip
