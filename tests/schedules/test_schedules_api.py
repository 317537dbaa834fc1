"""Issue 35, schedules: the REST API under /api/v1/tenants/{id}/schedules (operator or customer token,
tasks:read/write).

Validation names the field (a bad cron expression, zone or moment is a 400 problem+json), pause and resume move
the cursor, every write is audited, another operator's customer and schedules do not exist (404), and the fire
history lists the task each fire started. Real PostgreSQL; the instance is the protocol stub.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from conversations.choices import CUSTOMER_TOKEN_SCOPES
from conversations.tokens import customer_token_issue
from schedules.models import Schedule, ScheduleFire
from schedules.sweep import schedules_sweep
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.conversation_helpers import stub_tenant
from tests.vault.test_vault_helpers import assert_problem, make_tenant

pytestmark = pytest.mark.django_db

TASK = {"kind": "demo", "params": {"invoice": "all"}}


@pytest.fixture
def tenant(api):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(api.operator)
    yield tenant
    stub.stop()


def url(tenant: Any, *rest: str) -> str:
    return "/".join([f"/api/v1/tenants/{tenant.pk}/schedules", *rest])


def create(api: APIClient, tenant: Any, **body: Any) -> Any:
    return api.post(url(tenant), {"name": "reconcile", "cron": "0 8 * * *", "timezone": "Europe/Paris",
                                  "task": TASK, **body}, format="json")


def test_create_lists_next_fires_in_the_zone_and_is_audited(api, tenant):
    resp = create(api, tenant)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["cron"], body["timezone"], body["status"], body["catch_up"]) == (
        "0 8 * * *", "Europe/Paris", "active", "latest")
    assert body["task"] == TASK and body["message"] is None and body["target_type"] == "task"
    fires = [datetime.fromisoformat(t) for t in body["next_fires"]]
    assert len(fires) == 5 and fires == sorted(fires) and fires[0] > timezone.now()
    # 08:00 in Paris is 07:00 UTC in winter, 06:00 in summer: the time is the zone's, not UTC's.
    assert all(f.astimezone(UTC).hour in (6, 7) and f.minute == 0 for f in fires)
    assert {(f.astimezone(UTC) - fires[0].astimezone(UTC)).total_seconds() % 3600 for f in fires} == {0}
    row = AuditLog.objects.get(action=AuditAction.SCHEDULE_CREATE, target_id=body["id"])
    assert row.tenant_id == tenant.pk and row.data["name"] == "reconcile" and "params" not in row.data
    assert api.get(url(tenant, body["id"])).json()["next_fires"] == body["next_fires"]
    assert [s["id"] for s in api.get(url(tenant)).json()] == [body["id"]]


@pytest.mark.parametrize(("body", "field"), [
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "every morning"}, "cron"),
    ({"cron": "* * *"}, "cron"),
    ({"cron": "0 0 30 2 *"}, "cron"),  # parses, never fires
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"timezone": "+02:00"}, "timezone"),
    ({"cron": None, "at": "2020-01-01T08:00:00Z"}, "at"),
    ({"at": "2099-01-01T08:00:00Z"}, "cron"),  # both cron and at
    ({"task": {"kind": "no spaces allowed"}}, "task.kind"),
    ({"task": None, "message": {"thread": "bad thread!", "content": "hi"}}, "message.thread"),
    ({"task": None, "message": {"thread": "t1", "content": "   "}}, "message.content"),
    ({"message": {"thread": "t1", "content": "hi"}}, "task"),  # both targets
    ({"catch_up": "sometimes"}, "catch_up"),
    ({"catch_up_max": 0}, "catch_up_max"),
    ({"name": ""}, "name"),
])
def test_bad_input_is_a_400_naming_the_field(api, tenant, body, field):
    full = {"name": "reconcile", "cron": "0 8 * * *", "timezone": "UTC", "task": TASK, **body}
    full = {k: v for k, v in full.items() if v is not None}
    problem = assert_problem(api.post(url(tenant), full, format="json"), 400)
    fields = {problem.get("field")} | {e["field"] for e in problem.get("errors", [])}
    assert field in fields, problem
    assert not Schedule.objects.filter(tenant=tenant).exists()


def test_unknown_fields_and_duplicate_names_are_refused(api, tenant):
    assert "is_admin" in assert_problem(create(api, tenant, is_admin=True), 400)["detail"]
    assert create(api, tenant).status_code == 201
    assert assert_problem(create(api, tenant), 409)["type"].endswith("conflict")


def test_pause_and_resume_move_the_cursor_and_are_audited(api, tenant):
    schedule_id = create(api, tenant, cron="* * * * * *", timezone="UTC").json()["id"]
    paused = api.patch(url(tenant, schedule_id), {"paused": True}, format="json").json()
    assert (paused["status"], paused["next_fires"]) == ("paused", [])
    assert Schedule.objects.get(pk=schedule_id).next_fire_at is None
    assert schedules_sweep(now=timezone.now() + timedelta(seconds=30)).created == 0  # nothing fires while paused
    resumed = api.patch(url(tenant, schedule_id), {"paused": False}, format="json").json()
    assert resumed["status"] == "active" and len(resumed["next_fires"]) == 5
    actions = list(AuditLog.objects.filter(target_id=schedule_id).order_by("id").values_list("action", flat=True))
    assert actions == [AuditAction.SCHEDULE_CREATE, AuditAction.SCHEDULE_PAUSE, AuditAction.SCHEDULE_RESUME]


def test_patch_changes_timing_and_target_and_checks_them(api, tenant):
    schedule_id = create(api, tenant).json()["id"]
    problem = assert_problem(api.patch(url(tenant, schedule_id), {"cron": "99 * * * *"}, format="json"), 400)
    assert problem["field"] == "cron"
    problem = assert_problem(api.patch(url(tenant, schedule_id), {"timezone": "Nowhere/City"}, format="json"), 400)
    assert problem["field"] == "timezone"
    at = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    changed = api.patch(url(tenant, schedule_id), {"at": at.isoformat(), "message": {"thread": "follow-up",
                                                                                      "content": "How did it go?"}},
                        format="json").json()
    assert (changed["cron"], changed["target_type"], changed["task"]) == ("", "message", None)
    assert [datetime.fromisoformat(t) for t in changed["next_fires"]] == [at]
    assert AuditLog.objects.filter(action=AuditAction.SCHEDULE_UPDATE, target_id=schedule_id).count() == 1


def test_delete_is_audited_and_then_404(api, tenant):
    schedule_id = create(api, tenant).json()["id"]
    assert api.delete(url(tenant, schedule_id)).status_code == 204
    assert_problem(api.get(url(tenant, schedule_id)), 404)
    assert AuditLog.objects.filter(action=AuditAction.SCHEDULE_DELETE, target_id=schedule_id).exists()


def test_fires_list_the_task_each_fire_started(api, tenant):
    schedule_id = create(api, tenant, cron="* * * * * *", timezone="UTC").json()["id"]
    schedules_sweep(now=timezone.now() + timedelta(seconds=2))
    fires = api.get(url(tenant, schedule_id, "fires")).json()
    assert fires["count"] >= 2
    stored = {str(f.pk): f for f in ScheduleFire.objects.filter(schedule_id=schedule_id).select_related("inbox_item")}
    for fire in fires["results"]:
        assert fire["status"] == "dispatched" and fire["inbox_status"] == "delivered"
        assert fire["task_id"] == str(stored[fire["id"]].inbox_item.pk)  # the task id the instance runs it under
    assert [f["fire_time"] for f in fires["results"]] == sorted((f["fire_time"] for f in fires["results"]),
                                                                reverse=True)
    assert_problem(api.get(url(tenant, schedule_id, "fires"), {"limit": "0"}), 400)


def test_another_operator_sees_nothing_and_changes_nothing(api, tenant, make_token):
    schedule_id = create(api, tenant).json()["id"]
    other = operator_create(slug="op-other-sched", name="Other", actor=SYSTEM)
    other_tenant = make_tenant(other, "other-cust")
    b = APIClient()
    b.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(other)}")
    for method, path, body in (("get", url(tenant), None), ("post", url(tenant), {"name": "x", "cron": "* * * * *",
                                                                                   "task": TASK}),
                               ("get", url(tenant, schedule_id), None),
                               ("patch", url(tenant, schedule_id), {"paused": True}),
                               ("delete", url(tenant, schedule_id), None),
                               ("get", url(tenant, schedule_id, "fires"), None),
                               # B's own customer, A's schedule id: still not B's
                               ("get", url(other_tenant, schedule_id), None),
                               ("patch", url(other_tenant, schedule_id), {"paused": True}),
                               ("delete", url(other_tenant, schedule_id), None)):
        assert_problem(getattr(b, method)(path, body, format="json"), 404)
    assert b.get(url(other_tenant)).json() == []
    schedule = Schedule.objects.get(pk=schedule_id)
    assert schedule.status == "active" and Schedule.objects.count() == 1


def test_scopes_are_enforced(api, tenant, make_token):
    schedule_id = create(api, tenant).json()["id"]
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(api.operator, scopes=['tasks:read'])}")
    assert reader.get(url(tenant, schedule_id)).status_code == 200
    assert_problem(reader.patch(url(tenant, schedule_id), {"paused": True}, format="json"), 403)
    assert_problem(create(reader, tenant, name="other"), 403)
    nobody = APIClient()
    nobody.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(api.operator, scopes=['tenants:read'])}")
    assert_problem(nobody.get(url(tenant)), 403)


def _customer(tenant: Any, scopes: list[str]) -> APIClient:
    client = APIClient()
    ctk = customer_token_issue(tenant=tenant, scopes=scopes, actor=SYSTEM).plaintext
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ctk}")
    return client


def test_a_customer_token_creates_lists_pauses_and_deletes_its_own_tenants_schedules(api, tenant):
    customer = _customer(tenant, list(CUSTOMER_TOKEN_SCOPES))
    made = create(customer, tenant, name="my-reminder")
    assert made.status_code == 201, made.content
    schedule_id = made.json()["id"]
    assert [s["name"] for s in customer.get(url(tenant)).json()] == ["my-reminder"]
    paused = customer.patch(url(tenant, schedule_id), {"paused": True}, format="json")
    assert paused.status_code == 200 and paused.json()["status"] == "paused" and paused.json()["next_fires"] == []
    assert customer.patch(url(tenant, schedule_id), {"paused": False}, format="json").json()["status"] == "active"
    assert customer.get(url(tenant, schedule_id, "fires")).json()["count"] == 0
    # The operator sees what the customer made; the audit names the customer's token, never an operator token.
    assert [s["id"] for s in api.get(url(tenant)).json()] == [schedule_id]
    assert Schedule.objects.get(pk=schedule_id).created_by is None
    rows = AuditLog.objects.filter(tenant=tenant, action__startswith="schedule.").order_by("id")
    assert [r.action for r in rows] == [AuditAction.SCHEDULE_CREATE, AuditAction.SCHEDULE_PAUSE,
                                        AuditAction.SCHEDULE_RESUME]
    assert all(r.actor_label.startswith("customer token ") for r in rows)
    assert customer.delete(url(tenant, schedule_id)).status_code == 204
    assert not Schedule.objects.filter(pk=schedule_id).exists()
    # Its scopes still gate each method: a read-only customer token reads, and changes nothing.
    kept = create(api, tenant, name="operators").json()["id"]
    reader = _customer(tenant, ["tasks:read"])
    assert reader.get(url(tenant, kept)).status_code == 200
    assert_problem(reader.patch(url(tenant, kept), {"paused": True}, format="json"), 403)
    assert_problem(create(reader, tenant, name="nope"), 403)
    assert_problem(_customer(tenant, ["conversations:read"]).get(url(tenant)), 403)


def test_a_customer_token_reaches_no_other_tenants_schedules(api, tenant):
    sibling, sibling_stub = stub_tenant(api.operator)  # the same operator's other customer
    try:
        theirs = create(api, sibling, name="theirs").json()["id"]
        customer = _customer(tenant, list(CUSTOMER_TOKEN_SCOPES))
        for method, path, body in (("get", url(sibling), None),
                                   ("post", url(sibling), {"name": "x", "cron": "* * * * *", "task": TASK}),
                                   ("get", url(sibling, theirs), None),
                                   ("patch", url(sibling, theirs), {"paused": True}),
                                   ("delete", url(sibling, theirs), None),
                                   ("get", url(sibling, theirs, "fires"), None),
                                   # its own tenant in the path, the sibling's schedule id: not its schedule
                                   ("get", url(tenant, theirs), None),
                                   ("patch", url(tenant, theirs), {"paused": True}),
                                   ("delete", url(tenant, theirs), None)):
            assert_problem(getattr(customer, method)(path, body, format="json"), 404)
        refused = AuditLog.objects.filter(action="customer_token.refused", tenant=tenant, data__reason="another tenant")
        assert refused.count() == 6  # each attempt on the other tenant's path is audited
        still = Schedule.objects.get(pk=theirs)
        assert still.status == "active" and Schedule.objects.filter(tenant=sibling).count() == 1
        assert not Schedule.objects.filter(tenant=tenant).exists()
    finally:
        sibling_stub.stop()
