"""Levers on a stuck task through the control plane: `POST .../tasks/{id}/retry` (operator token, audited, 409 for a
task that is not blocked or failed, another operator's task is a 404), the Retry button on the portal's and the
dashboard's task page, and every blocked reason in words with the action that clears it (API, portal, dashboard).

Against the instance stub (tests/instance_stub.py), as tests/conversations/test_conversations_api.py; the runtime side
of the same levers (a real agent-host: retry from the checkpoint with each effect once, the step error's file:line, the
credential block resumed within a heartbeat) is tests/runtime/test_task_levers.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils.html import escape

from conversations.models import InboxItem
from instances.blocked_reasons import BLOCKED_REASONS
from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.conversation_helpers import post_json, stub_tenant
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.services import credential_put, credential_revoke

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
HOST_A = "levers-a.localhost"


def _block(stub, task_id: str, reason: str, detail: str = "") -> None:  # type: ignore[no-untyped-def]
    stub.tasks[task_id].update(status="blocked", blocked_reason=reason, blocked_detail=detail)


@pytest.fixture
def chat(operator):  # type: ignore[no-untyped-def]
    tenant, stub = stub_tenant(operator)
    yield tenant, stub
    stub.stop()


def test_retry_of_a_blocked_task_is_delivered_audited_and_explained(api, chat):
    tenant, stub = chat
    base = f"/api/v1/tenants/{tenant.pk}/tasks"
    task_id = post_json(api, base, {"kind": "demo"}).json()["task"]["id"]
    _block(stub, task_id, "poison_step", "step 'charge' failed 3 times; last error: ValueError: too many values "
                                         "to unpack (refund_agent/steps.py:42 in charge)")
    detail = api.get(f"{base}/{task_id}").json()["task"]
    assert detail["blocked_reason_text"] == BLOCKED_REASONS["poison_step"].text
    assert detail["blocked_action"].startswith("Read the step's error") and detail["retryable"] is True
    listed = api.get(f"{base}?status=blocked").json()["tasks"]
    assert [t["blocked_reason_text"] for t in listed] == [BLOCKED_REASONS["poison_step"].text]

    retried = api.post(f"{base}/{task_id}/retry", HTTP_IDEMPOTENCY_KEY="r-1")
    assert retried.status_code == 200, retried.content
    assert retried.json()["task"]["status"] == "pending" and stub.retries == [task_id]
    # The same key again is the same retry (one inbox item, one delivery).
    assert api.post(f"{base}/{task_id}/retry", HTTP_IDEMPOTENCY_KEY="r-1").status_code == 200
    assert stub.retries == [task_id] and InboxItem.objects.filter(tenant=tenant, kind="retry").count() == 1
    row = AuditLog.objects.get(action=AuditAction.TASK_RETRY, tenant=tenant)
    assert row.data["task"] == task_id
    # Not blocked any more: nothing to explain, nothing to retry (409 problem+json, as the instance said).
    assert api.get(f"{base}/{task_id}").json()["task"]["blocked_reason_text"] is None
    problem = assert_problem(api.post(f"{base}/{task_id}/retry"), 409)
    assert problem["code"] == "conflict" and "pending" in problem["detail"]
    assert_problem(post_json(api, f"{base}/{task_id}/retry", {"why": "no"}), 400)
    assert_problem(api.post(f"{base}/not-a-uuid/retry"), 404)


def test_retry_of_a_done_task_is_409_and_another_operators_task_is_404(api, chat, make_token):
    tenant, stub = chat
    base = f"/api/v1/tenants/{tenant.pk}/tasks"
    task_id = post_json(api, base, {"kind": "demo"}).json()["task"]["id"]
    stub.tasks[task_id]["status"] = "done"
    problem = assert_problem(api.post(f"{base}/{task_id}/retry"), 409)
    assert "done" in problem["detail"] and stub.retries == []

    from rest_framework.test import APIClient

    other = operator_create(slug="levers-b", name="Beta", actor=SYSTEM)
    client_b = APIClient()
    client_b.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(other)}")
    _block(stub, task_id, "poison_step")
    audited = AuditLog.objects.filter(action=AuditAction.TASK_RETRY).count()  # A's refused attempt is audited
    assert_problem(client_b.post(f"{base}/{task_id}/retry"), 404)
    assert stub.retries == [] and AuditLog.objects.filter(action=AuditAction.TASK_RETRY).count() == audited
    # Operator B's own tenant does not reach A's task either: the instance is A's only.
    tenant_b, stub_b = stub_tenant(other)
    try:
        assert_problem(client_b.post(f"/api/v1/tenants/{tenant_b.pk}/tasks/{task_id}/retry"), 404)
    finally:
        stub_b.stop()
    assert stub.tasks[task_id]["status"] == "blocked" and stub.retries == []


def test_the_portal_and_the_dashboard_show_the_cause_in_words_and_a_retry_button(db):
    op = operator_create(slug="levers-p", name="Portal Op", actor=SYSTEM, domains=[HOST_A])
    tenant, stub = stub_tenant(op)
    try:
        ada, viewer, staff = (User.objects.create_user(n) for n in ("ada", "vic", "stan"))
        OperatorMembership.objects.create(user=ada, operator=op, role="member")
        OperatorMembership.objects.create(user=viewer, operator=op, role="viewer")
        staff.is_staff = True
        staff.save()
        staff.user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
        from conversations.services import task_submit

        task_id = str(task_submit(tenant=tenant, kind="demo", params={}, idempotency_key=None, actor=SYSTEM).item.pk)
        _block(stub, task_id, "credential_unavailable", "credential 'openai' unavailable: control plane said 404")
        portal = Client(HTTP_HOST=HOST_A)
        portal.force_login(ada)
        page = portal.get(f"/customers/{tenant.pk}/tasks/{task_id}/").content.decode()
        reason = BLOCKED_REASONS["credential_unavailable"]
        assert escape(reason.text) in page and escape(reason.action) in page and escape("'openai'") in page
        assert f'action="/customers/{tenant.pk}/tasks/{task_id}/retry"' in page
        # A viewer reads the same words without the button.
        viewer_client = Client(HTTP_HOST=HOST_A)
        viewer_client.force_login(viewer)
        viewer_page = viewer_client.get(f"/customers/{tenant.pk}/tasks/{task_id}/").content.decode()
        assert escape(reason.text) in viewer_page and "/retry" not in viewer_page
        key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        done = portal.post(f"/customers/{tenant.pk}/tasks/{task_id}/retry", {"idempotency_key": key})
        assert done.status_code == 302 and done["Location"] == f"/customers/{tenant.pk}/tasks/{task_id}/"
        assert stub.retries == [task_id]
        assert AuditLog.objects.get(action=AuditAction.TASK_RETRY, tenant=tenant).actor_id == str(ada.pk)
        again = portal.post(f"/customers/{tenant.pk}/tasks/{task_id}/retry", {"idempotency_key": "other"}, follow=True)
        assert "Not retried" in again.content.decode()  # 409 from the instance, said in words

        _block(stub, task_id, "effect_in_doubt", "email (eff-1) awaits a human decision")
        dash = Client()
        dash.force_login(staff)
        page = dash.get(f"/dashboard/tenants/{tenant.pk}/tasks/{task_id}/").content.decode()
        in_doubt = BLOCKED_REASONS["effect_in_doubt"]
        assert escape(in_doubt.text) in page and escape(in_doubt.action) in page
        assert f'action="/dashboard/tenants/{tenant.pk}/tasks/{task_id}/retry"' in page
        assert dash.post(f"/dashboard/tenants/{tenant.pk}/tasks/{task_id}/retry",
                         {"idempotency_key": "d-1"}).status_code == 302
        assert stub.retries == [task_id, task_id]
    finally:
        stub.stop()


def test_every_blocked_reason_the_runtime_and_the_examples_raise_is_explained():
    """A new reason code without words would show as the generic sentence: the table must name it."""
    found: set[str] = set()
    patterns = (r'TaskBlocked\(\s*"([a-z_]+)"', r'_block\(rt, task\.id, "([a-z_]+)"',
                r'set_status\([^)]*?"blocked",\s*"([a-z_]+)"')
    for base in ("agent_runtime", "examples"):
        for path in (ROOT / base).rglob("*.py"):
            text = path.read_text()
            for pattern in patterns:
                found.update(re.findall(pattern, text))
    runner = (ROOT / "agent_runtime" / "host" / "runner.py").read_text()
    found.update(re.findall(r': "([a-z_]+)"', runner[runner.index("reasons: dict"):runner.index("return reasons.get")]))
    assert {"poison_step", "credential_unavailable", "unknown_kind", "effect_in_doubt"} <= found, found
    missing = sorted(found - set(BLOCKED_REASONS))
    assert missing == [], f"blocked reasons without words in instances/blocked_reasons.py: {missing}"
    for code, reason in BLOCKED_REASONS.items():
        assert reason.text.endswith(".") and reason.action.endswith("."), code


def test_the_instance_asks_whether_a_credential_is_there_without_reading_consuming_or_auditing_it(operator):
    """What the host polls, once a heartbeat, for a task blocked on a credential: HEAD 404 then 204; a one-time
    credential is still delivered afterwards (not consumed by the question), and no question is audited."""
    tenant = make_tenant(operator)
    other = make_tenant(operator)
    instance = bearer_client(make_instance(tenant))
    url = "/internal/v1/credentials/openai"
    audited = AuditLog.objects.filter(tenant=tenant).count()
    assert instance.head(url).status_code == 404
    credential_put(tenant=other, name="openai", value="sk-other", actor=SYSTEM)
    assert instance.head(url).status_code == 404  # another tenant's credential is not this one's
    credential_put(tenant=tenant, name="openai", value="sk-once", actor=SYSTEM, one_time=True)
    audited = AuditLog.objects.filter(tenant=tenant).count()
    for _ in range(3):
        answer = instance.head(url)
        assert answer.status_code == 204 and b"sk-once" not in answer.content
    assert AuditLog.objects.filter(tenant=tenant).count() == audited  # polling is not reading
    delivered = instance.get(url)
    assert delivered.status_code == 200 and delivered.json()["value"] == "sk-once"
    assert instance.head(url).status_code == 404  # consumed by the one delivery
    credential_put(tenant=tenant, name="anthropic", value="sk-a", actor=SYSTEM)
    credential_revoke(tenant=tenant, name="anthropic", actor=SYSTEM)
    assert instance.head("/internal/v1/credentials/anthropic").status_code == 404
    assert bearer_client("not-a-token").head(url).status_code == 401
