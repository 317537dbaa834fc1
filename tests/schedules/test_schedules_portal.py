"""Issue 35, schedules in the operator portal: a customer's page lists its schedules with their next fire times
(UTC), paused ones with none; members create (cron in a zone, or once at a local moment), pause, resume and delete
them, viewers only look, another operator's member reaches nothing (404). The chat panel sets a conversation's
thread policy. The staff dashboard shows the same schedules; staff with `dashboard.pause_schedule` pause and
resume them there, and nothing else."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from conversations.models import ThreadSetting
from portal.models import OperatorMembership
from schedules.models import Schedule
from schedules.services import schedule_create, schedule_update
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.vault.test_vault_helpers import make_tenant

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "sched-a.localhost", "sched-b.localhost"
NOW = datetime(2026, 12, 5, 6, 30, tzinfo=UTC)


def _member(operator, host: str) -> Client:  # type: ignore[no-untyped-def]
    user = User.objects.create_user(f"{operator.slug}-member")
    OperatorMembership.objects.create(user=user, operator=operator, role="member")
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return client


def test_the_customer_page_lists_schedules_with_their_next_fires():
    op_a = operator_create(slug="sched-a", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    op_b = operator_create(slug="sched-b", name="Beta", actor=SYSTEM, domains=[HOST_B])
    tenant = make_tenant(op_a, "acme")
    schedule_create(tenant=tenant, name="morning-reconcile", cron="0 8 * * *", timezone_name="Europe/Paris",
                    at=None, task={"kind": "reconcile", "params": {}}, message=None, actor=SYSTEM, now=NOW)
    paused = schedule_create(tenant=tenant, name="weekly-digest", cron="0 9 * * 1", timezone_name="UTC", at=None,
                             task=None, message={"thread": "digest", "content": "Your week"}, actor=SYSTEM, now=NOW)
    schedule_update(schedule=paused, changes={"paused": True}, actor=SYSTEM, now=NOW)

    page = _member(op_a, HOST_A).get(f"/customers/{tenant.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    section = html[html.index('id="h-schedules"'):]
    section = section[:section.index("</section>")]
    assert "morning-reconcile" in section and "0 8 * * * (Europe/Paris)" in section and "task reconcile" in section
    # 08:00 in Paris in December is 07:00 UTC: the next three, from the day the schedule was made.
    for day in (5, 6, 7):
        assert f'datetime="2026-12-0{day}T07:00:00+00:00"' in section
    assert "weekly-digest" in section and "message into digest" in section and "paused" in section
    assert section.count("<time ") == 3  # the paused schedule lists no next fire

    assert _member(op_b, HOST_B).get(f"/customers/{tenant.pk}/").status_code == 404


def _with_role(operator, host: str, role: str) -> Client:  # type: ignore[no-untyped-def]
    user = User.objects.create_user(f"{operator.slug}-{role}")
    OperatorMembership.objects.create(user=user, operator=operator, role=role)
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return client


def _section(html: str, heading: str) -> str:
    section = html[html.index(f'id="{heading}"'):]
    return section[:section.index("</section>")]


FORM = {"name": "morning", "cron": "0 8 * * *", "at": "", "timezone": "Europe/Paris", "kind": "reconcile",
        "params": '{"ledger": "main"}', "thread": "", "content": "", "catch_up": "latest"}


def test_a_member_creates_pauses_resumes_and_deletes_a_schedule_in_the_portal():
    op_a = operator_create(slug="sched-c", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    tenant = make_tenant(op_a, "acme")
    member = _with_role(op_a, HOST_A, "member")
    base = f"/customers/{tenant.pk}/schedules/"
    page = member.get(f"/customers/{tenant.pk}/").content.decode()
    assert 'data-testid="schedule-form"' in _section(page, "h-schedules")

    made = member.post(base, FORM)
    assert made.status_code == 302 and made["Location"].endswith(f"/customers/{tenant.pk}/#schedules")
    schedule = Schedule.objects.get(tenant=tenant, name="morning")
    assert (schedule.cron, schedule.timezone, schedule.target) == ("0 8 * * *", "Europe/Paris",
                                                                   {"kind": "reconcile", "params": {"ledger": "main"}})
    audit = AuditLog.objects.get(action=AuditAction.SCHEDULE_CREATE, tenant=tenant)
    assert audit.actor_label.endswith("via sched-c portal")
    section = _section(member.get(f"/customers/{tenant.pk}/").content.decode(), "h-schedules")
    assert "morning" in section and section.count("<time ") == 3 and ">Pause<" in section

    # Once, at a moment typed in the customer's zone: 09:30 in Paris in July is 07:30 UTC.
    once = member.post(base, {**FORM, "name": "follow-up", "cron": "", "at": "2031-07-01T09:30",
                              "kind": "", "params": "", "thread": "support-42", "content": "Did it arrive?"})
    assert once.status_code == 302, once.content.decode()[-2000:]
    follow = Schedule.objects.get(tenant=tenant, name="follow-up")
    assert follow.at == datetime(2031, 7, 1, 7, 30, tzinfo=UTC)
    assert follow.target == {"thread": "support-42", "content": "Did it arrive?"}

    # Refusals come back on the form, next to the field the service named; nothing is made.
    bad = member.post(base, {**FORM, "name": "bad", "cron": "61 * * * *"})
    assert bad.status_code == 400
    errors = _section(bad.content.decode(), "h-schedules")
    assert 'id="id_cron_error"' in errors and "<details open" in errors
    assert member.post(base, {**FORM, "name": "bad", "timezone": "Mars/Olympus"}).status_code == 400
    assert member.post(base, {**FORM, "name": "bad", "params": "[1]"}).status_code == 400
    assert member.post(base, {**FORM, "name": "morning"}).status_code == 400  # the name is taken
    assert not Schedule.objects.filter(tenant=tenant, name="bad").exists()

    assert member.post(f"{base}{schedule.pk}/pause/").status_code == 302
    schedule.refresh_from_db()
    assert schedule.status == "paused" and schedule.next_fire_at is None
    section = _section(member.get(f"/customers/{tenant.pk}/").content.decode(), "h-schedules")
    assert ">Resume<" in section
    assert member.post(f"{base}{schedule.pk}/resume/").status_code == 302
    schedule.refresh_from_db()
    assert schedule.status == "active" and schedule.next_fire_at is not None
    assert member.post(f"{base}{schedule.pk}/explode/").status_code == 404

    confirm = member.get(f"{base}{schedule.pk}/delete/")
    assert confirm.status_code == 200 and "Delete schedule morning?" in confirm.content.decode()
    assert Schedule.objects.filter(pk=schedule.pk).exists()  # a GET deletes nothing
    assert member.post(f"{base}{schedule.pk}/delete/").status_code == 302
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    actions = list(AuditLog.objects.filter(tenant=tenant, action__startswith="schedule.").order_by("id")
                   .values_list("action", flat=True))
    assert actions == [AuditAction.SCHEDULE_CREATE, AuditAction.SCHEDULE_CREATE, AuditAction.SCHEDULE_PAUSE,
                       AuditAction.SCHEDULE_RESUME, AuditAction.SCHEDULE_DELETE]


def test_viewers_only_look_and_another_operator_reaches_nothing():
    op_a = operator_create(slug="sched-d", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    op_b = operator_create(slug="sched-e", name="Beta", actor=SYSTEM, domains=[HOST_B])
    tenant = make_tenant(op_a, "acme")
    schedule = schedule_create(tenant=tenant, name="nightly", cron="0 3 * * *", timezone_name="UTC", at=None,
                               task={"kind": "demo", "params": {}}, message=None, actor=SYSTEM)
    viewer = _with_role(op_a, HOST_A, "viewer")
    section = _section(viewer.get(f"/customers/{tenant.pk}/").content.decode(), "h-schedules")
    assert "nightly" in section and "schedule-form" not in section and ">Pause<" not in section
    base = f"/customers/{tenant.pk}/schedules/"
    assert viewer.post(base, {**FORM, "name": "sneaky"}).status_code == 403
    assert viewer.post(f"{base}{schedule.pk}/pause/").status_code == 403
    assert viewer.post(f"{base}{schedule.pk}/delete/").status_code == 403
    assert viewer.post(f"/customers/{tenant.pk}/threads/portal/policy", {"policy": "reject"}).status_code == 403
    other = _with_role(op_b, HOST_B, "admin")
    for path, body in ((base, {**FORM, "name": "sneaky"}), (f"{base}{schedule.pk}/pause/", {}),
                       (f"{base}{schedule.pk}/delete/", {}),
                       (f"/customers/{tenant.pk}/threads/portal/policy", {"policy": "reject"})):
        assert other.post(path, body).status_code == 404
    schedule.refresh_from_db()
    assert schedule.status == "active" and list(Schedule.objects.filter(tenant=tenant)) == [schedule]
    assert not ThreadSetting.objects.exists()


def test_a_member_chooses_a_conversations_thread_policy_in_the_chat_panel():
    op_a = operator_create(slug="sched-f", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    tenant = make_tenant(op_a, "acme")
    member = _with_role(op_a, HOST_A, "member")
    chat = _section(member.get(f"/customers/{tenant.pk}/?thread=support-7").content.decode(), "h-chat")
    assert 'data-testid="thread-policy"' in chat and '<option value="enqueue" selected>' in chat
    done = member.post(f"/customers/{tenant.pk}/threads/support-7/policy", {"policy": "rollback"})
    assert done.status_code == 302 and done["Location"].endswith("?thread=support-7#chat")
    assert ThreadSetting.objects.get(tenant=tenant, thread="support-7").policy == "rollback"
    row = AuditLog.objects.get(tenant=tenant, action=AuditAction.CONVERSATION_THREAD_POLICY_SET)
    assert row.data == {"thread": "support-7", "policy": "rollback", "before": "enqueue"}
    chat = _section(member.get(f"/customers/{tenant.pk}/?thread=support-7").content.decode(), "h-chat")
    assert '<option value="rollback" selected>' in chat and "never undone" in chat
    assert member.post(f"/customers/{tenant.pk}/threads/support-7/policy", {"policy": "yolo"}).status_code == 302
    assert member.post(f"/customers/{tenant.pk}/threads/bad thread!/policy", {"policy": "reject"}).status_code == 302
    assert ThreadSetting.objects.get(tenant=tenant, thread="support-7").policy == "rollback"
    assert ThreadSetting.objects.count() == 1
    viewer = _with_role(op_a, HOST_A, "viewer")
    chat = _section(viewer.get(f"/customers/{tenant.pk}/?thread=support-7").content.decode(), "h-chat")
    assert "<select" not in chat and "<strong>rollback</strong>" in chat


def test_the_staff_dashboard_shows_a_customers_schedules_read_only_with_next_fires():
    op_a = operator_create(slug="sched-g", name="Alpha", actor=SYSTEM)
    tenant = make_tenant(op_a, "acme")
    schedule_create(tenant=tenant, name="morning-reconcile", cron="0 8 * * *", timezone_name="Europe/Paris",
                    at=None, task={"kind": "reconcile", "params": {}}, message=None, actor=SYSTEM, now=NOW)
    schedule_create(tenant=tenant, name="agent-follow-up", cron="", timezone_name="UTC",
                    at=datetime(2031, 1, 1, tzinfo=UTC), task={"kind": "followup", "params": {}}, message=None,
                    actor=SYSTEM, idempotency_key="eff-abc", created_by_task="4f1c2d3e-0000-0000-0000-000000000000")
    staff = Client()
    staff.force_login(User.objects.create_user("staff-sched", is_staff=True))
    page = staff.get(f"/dashboard/tenants/{tenant.pk}/")
    assert page.status_code == 200
    section = _section(page.content.decode(), "h-schedules")
    assert "morning-reconcile" in section and "0 8 * * * (Europe/Paris)" in section
    for day in (5, 6, 7):
        assert f'datetime="2026-12-0{day}T07:00:00+00:00"' in section
    assert "agent-follow-up" in section and "by agent task 4f1c2d3e" in section
    assert 'datetime="2031-01-01T00:00:00+00:00"' in section
    assert "<form" not in section and "Delete" not in section  # read-only without dashboard.pause_schedule
    made = Schedule.objects.get(tenant=tenant, name="morning-reconcile")
    pause = f"/dashboard/tenants/{tenant.pk}/schedules/{made.pk}/pause/"
    assert staff.post(pause).status_code == 403
    assert Schedule.objects.get(pk=made.pk).status == "active"

    # On call, a schedule firing into trouble is paused from here (as a blocked task is cancelled), and resumed.
    oncall = User.objects.create_user("oncall-sched", is_staff=True)
    oncall.user_permissions.add(Permission.objects.get(content_type__app_label="dashboard", codename="pause_schedule"))
    staff.force_login(oncall)
    section = _section(staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode(), "h-schedules")
    assert section.count(">Pause<") == 2 and "Delete" not in section
    paused = staff.post(pause)
    assert paused.status_code == 302 and paused["Location"].endswith(f"/dashboard/tenants/{tenant.pk}/#schedules")
    made.refresh_from_db()
    assert made.status == "paused" and made.next_fire_at is None
    assert ">Resume<" in _section(staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode(), "h-schedules")
    assert staff.post(f"/dashboard/tenants/{tenant.pk}/schedules/{made.pk}/resume/").status_code == 302
    made.refresh_from_db()
    assert made.status == "active" and made.next_fire_at is not None
    assert staff.post(f"/dashboard/tenants/{tenant.pk}/schedules/{made.pk}/delete/").status_code == 404
    assert staff.get(pause).status_code == 405
    rows = AuditLog.objects.filter(tenant=tenant, target_id=str(made.pk), action__in=[
        AuditAction.SCHEDULE_PAUSE, AuditAction.SCHEDULE_RESUME]).order_by("id")
    assert [(r.action, r.actor_label) for r in rows] == [(AuditAction.SCHEDULE_PAUSE, "oncall-sched"),
                                                         (AuditAction.SCHEDULE_RESUME, "oncall-sched")]
    # Another tenant's schedule under this tenant's path is not found, and stays as it was.
    other = make_tenant(op_a, "other")
    theirs = schedule_create(tenant=other, name="theirs", cron="0 9 * * *", timezone_name="UTC", at=None,
                             task={"kind": "x", "params": {}}, message=None, actor=SYSTEM, now=NOW)
    assert staff.post(f"/dashboard/tenants/{tenant.pk}/schedules/{theirs.pk}/pause/").status_code == 404
    assert Schedule.objects.get(pk=theirs.pk).status == "active"
