"""Staff dashboard: every page and action, for staff (with and without the action's permission),
operator users and anonymous visitors; nothing secret ever rendered."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from portal.models import OperatorMembership
from provisioning.choices import InstanceStatus, StepStatus, WorkflowStatus
from provisioning.models import AgentInstance, ProvisionedResource, WorkflowRun
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from vault.services import credential_put

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


def _user(username: str, *, staff: bool = False, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=staff)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


def _client(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def tenant(operator, tmp_path) -> Tenant:
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="acme", name="Acme Corp", actor=SYSTEM)
    ProvisionedResource.objects.create(tenant=tenant, kind="database", driver="postgres-schema",
                                       external_id="schema:t_abc", status="ready")
    ProvisionedResource.objects.create(tenant=tenant, kind="volume", driver="local-volume",
                                       external_id=str(tmp_path), details={"path": str(tmp_path)}, status="ready")
    AgentInstance.objects.filter(tenant=tenant).update(
        status=InstanceStatus.RUNNING, last_heartbeat_at=timezone.now(), progress={"task": "t-1", "step": 7})
    return tenant


@pytest.fixture
def failed_run(tenant) -> WorkflowRun:
    run = WorkflowRun.objects.get(tenant=tenant)
    run.steps.filter(name="database").update(status=StepStatus.FAILED, attempts=5, error="ProvisioningError: boom")
    run.status = WorkflowStatus.FAILED
    run.error = "step database failed: ProvisioningError: boom"
    run.save()
    Tenant.objects.filter(pk=tenant.pk).update(status="failed")
    return run


PAGES = ["/dashboard/", "/dashboard/live", "/dashboard/tenants/", "/dashboard/tenants/?q=acme&status=pending",
         "/dashboard/tenants/?workflow=failed"]


@pytest.mark.parametrize("url", PAGES)
def test_pages_need_a_staff_login(url, tenant):
    anonymous = _client(None).get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/dashboard/login/")
    operator_user = _user("op-user")
    OperatorMembership.objects.create(user=operator_user, operator=tenant.operator, role="admin")
    assert _client(operator_user).get(url).status_code == 403
    assert _client(_user("staff", staff=True)).get(url).status_code == 200


def test_tenant_page_shows_resources_timeline_heartbeat_credentials_and_audit(tenant):
    credential_put(tenant=tenant, name="crm-key", value="s3cr3t-value-never-shown", actor=SYSTEM)
    staff = _client(_user("staff", staff=True))
    for url in (f"/dashboard/tenants/{tenant.pk}/", f"/dashboard/tenants/{tenant.pk}/live"):
        resp = staff.get(url)
        assert resp.status_code == 200
        body = resp.content.decode()
        assert "schema:t_abc" in body  # resource external id
        assert "database" in body and "runtime" in body  # workflow timeline, step by step
        assert "healthy" in body and "Working on task t-1, step 7" in body  # heartbeat and progress, in words
        assert "step=" not in body and "None" not in body
        assert "s3cr3t-value-never-shown" not in body
    body = staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert "crm-key" in body  # credential metadata
    assert "tenant.onboard" in body  # audit log
    # Actors by name and details as "key: value", not "system: system" and Python dict text.
    assert "system: system" not in body and "{&#x27;" not in body and "{'" not in body
    assert "credential.put" in body and "name: crm-key" in body
    assert "Not tracked yet" in body or "Recovery events" in body


def test_unknown_tenant_is_404(tenant):
    staff = _client(_user("staff", staff=True))
    assert staff.get("/dashboard/tenants/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert staff.get("/dashboard/tenants/not-a-uuid/").status_code == 404


def test_overview_counts(tenant, failed_run):
    resp = _client(_user("staff", staff=True)).get("/dashboard/")
    o = resp.context["o"]
    assert dict(o["tenants"])["failed"] == 1
    assert o["instances"]["healthy"] == 1
    assert o["workflows_failed"] == 1
    assert 'data-testid="recoveries-24h"' in resp.content.decode()


def test_search_filter_and_paginate(operator, settings):
    settings.DASHBOARD_PAGE_SIZE = 2
    for i in range(5):
        tenant_onboard(allow_no_release=True, operator=operator, slug=f"cust-{i}", name=f"Customer {i}", actor=SYSTEM)
    staff = _client(_user("staff", staff=True))
    first = staff.get("/dashboard/tenants/")
    assert first.context["page"].paginator.num_pages == 3
    assert "page=2" in first.content.decode()
    found = staff.get("/dashboard/tenants/?q=cust-3")
    assert [t.slug for t in found.context["page"]] == ["cust-3"]
    assert staff.get("/dashboard/tenants/?status=ready").context["page"].paginator.count == 0
    assert staff.get(f"/dashboard/tenants/?operator={operator.slug}").context["page"].paginator.count == 5


def test_retry_needs_permission_confirms_then_retries(tenant, failed_run):
    url = f"/dashboard/tenants/{tenant.pk}/runs/{failed_run.pk}/retry/"
    assert _client(None).post(url).status_code == 302
    assert AuditLog.objects.filter(action="workflow.onboard.retry").count() == 0
    without = _client(_user("viewer", staff=True))
    assert without.get(url).status_code == 403
    assert without.post(url).status_code == 403
    failed_run.refresh_from_db()
    assert failed_run.status == WorkflowStatus.FAILED

    allowed = _client(_user("oncall", staff=True, perms=("dashboard.retry_workflow",)))
    confirm = allowed.get(url)
    assert confirm.status_code == 200
    body = confirm.content.decode()
    assert "Retry the failed step?" in body and "database" in body
    assert re.search(r'name="csrfmiddlewaretoken"', body)
    failed_run.refresh_from_db()
    assert failed_run.status == WorkflowStatus.FAILED  # GET changes nothing

    done = allowed.post(url, follow=True)
    assert done.status_code == 200
    failed_run.refresh_from_db()
    assert failed_run.status == WorkflowStatus.PENDING
    assert Tenant.objects.get(pk=tenant.pk).status == "provisioning"
    assert AuditLog.objects.filter(action="workflow.onboard.retry", actor_label="oncall").count() == 1
    again = allowed.post(url, follow=True)  # not failed any more: refused with a message
    assert "only a failed workflow can be retried" in again.content.decode()


def test_actions_require_csrf(tenant, failed_run):
    user = _user("oncall", staff=True, perms=("dashboard.retry_workflow",))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    resp = client.post(f"/dashboard/tenants/{tenant.pk}/runs/{failed_run.pk}/retry/")
    assert resp.status_code == 403
    failed_run.refresh_from_db()
    assert failed_run.status == WorkflowStatus.FAILED


def test_retry_of_another_tenants_run_is_404(operator, tenant, failed_run):
    other, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="other", name="Other", actor=SYSTEM)
    client = _client(_user("oncall", staff=True, perms=("dashboard.retry_workflow",)))
    assert client.post(f"/dashboard/tenants/{other.pk}/runs/{failed_run.pk}/retry/").status_code == 404


@pytest.mark.parametrize("action, perm", [
    ("suspend", "dashboard.suspend_tenant"),
    ("deprovision", "dashboard.deprovision_tenant"),
    ("rotate_keys", "dashboard.rotate_keys"),
    ("restart", "dashboard.restart_instance"),
    ("kill", "dashboard.kill_instance"),
    ("recover", "dashboard.restart_instance"),
])
def test_each_action_needs_its_own_permission(tenant, action, perm):
    url = f"/dashboard/tenants/{tenant.pk}/actions/{action}/"
    other_perm = "dashboard.retry_workflow"
    assert _client(_user("a", staff=True, perms=(other_perm,))).get(url).status_code == 403
    assert _client(_user("b", staff=True, perms=(other_perm,))).post(url).status_code == 403
    allowed = _client(_user("c", staff=True, perms=(perm,)))
    assert allowed.get(url).status_code == 200


def test_suspend_resume_and_deprovision(tenant):
    Tenant.objects.filter(pk=tenant.pk).update(status="ready")
    client = _client(_user("oncall", staff=True,
                           perms=("dashboard.suspend_tenant", "dashboard.deprovision_tenant")))
    client.post(f"/dashboard/tenants/{tenant.pk}/actions/suspend/")
    assert Tenant.objects.get(pk=tenant.pk).status == "suspended"
    client.post(f"/dashboard/tenants/{tenant.pk}/actions/resume/")
    assert Tenant.objects.get(pk=tenant.pk).status == "ready"
    client.post(f"/dashboard/tenants/{tenant.pk}/actions/deprovision/", {"confirm_slug": "acme"})
    assert Tenant.objects.get(pk=tenant.pk).status == "deprovisioning"
    assert WorkflowRun.objects.filter(tenant=tenant, kind="deprovision").count() == 1


def test_deprovision_refuses_unless_the_tenants_slug_is_typed(tenant):
    Tenant.objects.filter(pk=tenant.pk).update(status="ready")
    client = _client(_user("oncall", staff=True, perms=("dashboard.deprovision_tenant",)))
    url = f"/dashboard/tenants/{tenant.pk}/actions/deprovision/"
    confirm = client.get(url).content.decode()
    assert 'name="confirm_slug"' in confirm and "Type acme exactly." in confirm
    audit_rows = AuditLog.objects.filter(tenant=tenant).count()
    for body in ({}, {"confirm_slug": ""}, {"confirm_slug": "acm"}, {"confirm_slug": "ACME"},
                 {"confirm_slug": "acme-x"}, {"confirm_slug": tenant.name}):
        resp = client.post(url, body)
        assert resp.status_code == 400, body
        assert 'role="alert"' in resp.content.decode(), body
        assert Tenant.objects.get(pk=tenant.pk).status == "ready", body
    assert "That is not acme; nothing was deprovisioned." in resp.content.decode()
    assert not WorkflowRun.objects.filter(tenant=tenant, kind="deprovision").exists()
    assert AuditLog.objects.filter(tenant=tenant).count() == audit_rows
    assert "confirm_slug" not in client.get(f"/dashboard/tenants/{tenant.pk}/actions/suspend/").content.decode()
    resp = client.post(url, {"confirm_slug": " acme "}, follow=True)  # spaces around a paste are not a mismatch
    assert resp.status_code == 200 and "Deprovisioning started" in resp.content.decode()
    assert Tenant.objects.get(pk=tenant.pk).status == "deprovisioning"


def test_rotate_keys_starts_rotation_jobs(tenant):
    from vault.models import RotationJob

    credential_put(tenant=tenant, name="crm-key", value="v", actor=SYSTEM)
    client = _client(_user("oncall", staff=True, perms=("dashboard.rotate_keys",)))
    resp = client.post(f"/dashboard/tenants/{tenant.pk}/actions/rotate_keys/", follow=True)
    assert "Key rotation queued" in resp.content.decode()
    assert RotationJob.objects.filter(tenant=tenant).count() == 2


def test_kill_when_not_running_locally_is_a_clear_message(tenant):
    client = _client(_user("oncall", staff=True, perms=("dashboard.kill_instance",)))
    resp = client.post(f"/dashboard/tenants/{tenant.pk}/actions/kill/", follow=True)
    assert "not running locally" in resp.content.decode()


def test_unknown_action_is_404(tenant):
    client = _client(User.objects.create_superuser("root", password=PASSWORD))
    assert client.get(f"/dashboard/tenants/{tenant.pk}/actions/explode/").status_code == 404


def test_staff_login_refuses_non_staff(operator):
    _user("plain")
    _user("staffer", staff=True)
    client = Client()
    resp = client.post("/dashboard/login/", {"username": "plain", "password": PASSWORD})
    assert resp.status_code == 200 and "correct username and password" in resp.content.decode()
    resp = client.post("/dashboard/login/", {"username": "staffer", "password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/dashboard/"


def test_dashboard_is_not_served_on_operator_hosts(operator):
    operator.domains = ["portal-a.localhost"]
    operator.save()
    client = _client(User.objects.create_superuser("root", password=PASSWORD))
    assert client.get("/dashboard/", HTTP_HOST="portal-a.localhost").status_code == 404
    assert client.get("/admin/", HTTP_HOST="portal-a.localhost").status_code == 404


def test_quarantined_instance_shows_why_and_one_click_retry_starts_a_recovery(tenant):
    from provisioning.models import RecoveryEvent

    Tenant.objects.filter(pk=tenant.pk).update(status="degraded", status_reason="quarantined after 3 failed recoveries")
    AgentInstance.objects.filter(tenant=tenant).update(
        status=InstanceStatus.QUARANTINED, status_reason="step start failed: agent-host exited during start")
    staff = _client(_user("oncall", staff=True, perms=("dashboard.restart_instance",)))
    page = staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert "agent-host exited during start" in page and 'data-testid="retry-recovery"' in page
    viewer = _client(_user("viewer", staff=True)).get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert 'data-testid="retry-recovery"' not in viewer
    resp = staff.post(f"/dashboard/tenants/{tenant.pk}/actions/recover/", follow=True)
    assert "A recovery was started" in resp.content.decode()
    event = RecoveryEvent.objects.get(tenant=tenant)
    assert event.reason == "manual" and event.outcome == "pending"
    assert AgentInstance.objects.get(tenant=tenant).status == "recovering"
    assert Tenant.objects.get(pk=tenant.pk).status == "recovering"


def test_an_agent_package_that_failed_to_load_is_shown_from_the_heartbeat(tenant):
    """agent-host stays up, not ready, and says why in its heartbeat; the tenant page shows that sentence."""
    from provisioning.recovery.heartbeats import heartbeat_store

    instance = AgentInstance.objects.get(tenant=tenant)
    error = "acme-agent (entry point 'support = acme.agent:app'): failed to import: ImportError: no module named x"
    heartbeat_store().record(str(instance.pk), {"status": "agent_load_failed", "progress_seq": 0, "error": error})
    page = _client(_user("oncall", staff=True)).get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert 'data-testid="instance-error"' in page and "failed to import: ImportError" in page
    assert "The agent package failed to load" in page


def test_recoveries_across_tenants_with_filters_and_time_to_resume(tenant, operator):
    from datetime import timedelta

    from provisioning.models import RecoveryEvent

    other, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="globex", name="Globex", actor=SYSTEM)
    now = timezone.now()
    RecoveryEvent.objects.create(tenant=tenant, instance=tenant.instance, reason="dead", detail="no heartbeat",
                                 detected_at=now - timedelta(seconds=30), resumed_at=now - timedelta(seconds=26),
                                 from_checkpoint="12", steps_lost=0, outcome="succeeded")
    RecoveryEvent.objects.create(tenant=other, instance=other.instance, reason="hung", detail="progress stalled",
                                 detected_at=now, outcome="failed")
    client = _client(_user("oncall", staff=True))
    page = client.get("/dashboard/recoveries/")
    assert page.status_code == 200
    body = page.content.decode()
    table = body.split('data-testid="recoveries"')[1]
    assert table.index("globex") < table.index("acme")  # newest first, every tenant
    assert "4.0 s" in body and "checkpoint <code>12</code>" in body
    # The chart beside the table, drawn on the server: one bar for the resumed one, an empty slot for the other.
    chart = body.split('data-testid="recovery-chart"')[1].split("</svg>")[0]
    assert chart.count('class="bar"') == 1 and chart.count('class="bar-missing"') == 1
    assert "acme" in chart and ": 4.0 s</title>" in chart and "<script" not in chart and "http" not in \
        chart.replace("http://www.w3.org/2000/svg", "")
    only_dead = client.get("/dashboard/recoveries/?reason=dead").content.decode()
    assert "acme" in only_dead and "globex" not in only_dead.split("<tbody>")[1]
    assert _client(_user("nobody")).get("/dashboard/recoveries/").status_code in (302, 403)


def test_events_across_operators_newest_first_filtered_and_paginated(tenant, operator, settings):
    from tenants.services import operator_create
    from webhooks.services import event_record

    other_operator = operator_create(slug="op-other-events", name="Other", actor=SYSTEM)
    globex, _ = tenant_onboard(operator=other_operator, slug="globex", name="Globex",
                               actor=SYSTEM, allow_no_release=True)
    event_record(operator_id=operator.pk, tenant=tenant, type="recovery.succeeded",
                 data={"reason": "dead", "took_s": 4.0, "from_checkpoint": "12"})
    newest = event_record(operator_id=other_operator.pk, tenant=globex, type="instance.killed",
                          data={"pid": 4242, "by": {"kind": "user", "label": "oncall"}})
    client = _client(_user("oncall", staff=True))
    body = client.get("/dashboard/events/").content.decode()
    table = body.split('data-testid="events"')[1]
    assert table.index(newest.id) < table.index("recovery.succeeded") < table.index("tenant.created")
    assert "by: {kind: user, label: oncall} · pid: 4242" in table  # key: value (in jsonb's key order), not dict text
    assert "reason: dead · took s: 4.0 · from checkpoint: 12" in table and "{&#x27;" not in table
    assert 'aria-current="page">Events</a>' in body

    def rows(query: str) -> str:
        return client.get(f"/dashboard/events/?{query}").content.decode().split("<tbody>")[1]

    assert "recovery.succeeded" in rows("type=recovery.*") and "instance.killed" not in rows("type=recovery.*")
    assert "tenant.created" not in rows("type=recovery.*")
    by_operator = rows(f"operator={other_operator.slug}")
    assert "instance.killed" in by_operator and "acme" not in by_operator
    by_tenant = rows("tenant=acme")
    assert "recovery.succeeded" in by_tenant and "globex" not in by_tenant
    assert "No events match." in rows("tenant=acme&type=instance.*")
    assert "recovery.succeeded" in rows("type=nonsense")  # an unoffered type is ignored, not a 500

    event_record(operator_id=operator.pk, tenant=tenant, type="tenant.suspended", data={})
    settings.DASHBOARD_PAGE_SIZE = 2
    first = client.get("/dashboard/events/?tenant=acme")
    assert first.context["page"].paginator.count >= 3  # its tenant.created, and the two recorded above
    assert "tenant.suspended" in first.content.decode() and 'href="?tenant=acme&amp;page=2"' in first.content.decode()
    second = client.get("/dashboard/events/?tenant=acme&page=2")
    assert second.context["page"].number == 2 and 'href="?tenant=acme&amp;page=1"' in second.content.decode()
    assert "tenant.suspended" not in second.content.decode().split("<tbody>")[1]
    assert _client(_user("nobody")).get("/dashboard/events/").status_code in (302, 403)
