"""The portal's and the dashboard's screens for a tenant's agent (chat, reply stream, tasks, one task, log,
the effects-in-doubt queue and its decide action), with Django's test client against the instance stub
(tests/instance_stub.py). The same chat against a real agent-host, SIGKILLed mid-reply, is in
tests/browser/test_chat.py.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from conversations.models import InboxItem
from dashboard.effect_queue import effect_queue
from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.conversation_helpers import sse_events, stub_tenant

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "portal-a.localhost", "portal-b.localhost"


@pytest.fixture
def world(db):  # type: ignore[no-untyped-def]
    op_a = operator_create(slug="scr-a", name="Alpha Agents", actor=SYSTEM, domains=[HOST_A])
    op_b = operator_create(slug="scr-b", name="Beta Bots", actor=SYSTEM, domains=[HOST_B])
    tenant_a, stub_a = stub_tenant(op_a, kinds=("demo", "chat"))
    tenant_b, stub_b = stub_tenant(op_b, kinds=("demo", "chat"))
    users = {name: User.objects.create_user(name) for name in ("ada", "bea", "staff", "viewer")}
    OperatorMembership.objects.create(user=users["ada"], operator=op_a, role="member")
    OperatorMembership.objects.create(user=users["bea"], operator=op_b, role="admin")
    for name in ("staff", "viewer"):
        users[name].is_staff = True
        users[name].save()
    users["staff"].user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
    yield {"a": tenant_a, "b": tenant_b, "stub_a": stub_a, "stub_b": stub_b, "users": users}
    stub_a.stop()
    stub_b.stop()


def _client(user: User, host: str = "testserver") -> Client:
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return client


def portal(world, who: str = "ada") -> Client:  # type: ignore[no-untyped-def]
    return _client(world["users"][who], HOST_B if who == "bea" else HOST_A)


def _send(client: Client, url: str, content: str, key: str):  # type: ignore[no-untyped-def]
    return client.post(url, {"content": content}, HTTP_ACCEPT="application/json", HTTP_IDEMPOTENCY_KEY=key)


# --- portal


def test_customer_page_has_the_chat_panel_with_the_thread_and_a_static_script(world):
    tenant, stub = world["a"], world["stub_a"]
    client = portal(world)
    _send(client, f"/customers/{tenant.pk}/threads/portal/messages", "hi there", "k-1")
    page = client.get(f"/customers/{tenant.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="chat"' in html and "hi there" in html and "echo: hi there" in html
    assert "/static/ui/chat.js" in html and "<script>" not in html  # the CSP forbids inline scripts
    assert f'href="/customers/{tenant.pk}/tasks/"' in html and f'href="/customers/{tenant.pk}/logs/"' in html
    assert stub.user_messages("portal")[0]["content"] == "hi there"


def test_portal_send_is_idempotent_and_the_reply_streams(world):
    tenant, stub = world["a"], world["stub_a"]
    client = portal(world)
    url = f"/customers/{tenant.pk}/threads/portal/messages"
    first = _send(client, url, "where is my order", "same-key")
    assert first.status_code == 201, first.content
    again = _send(client, url, "where is my order", "same-key")  # the page retrying after a lost answer
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert len(stub.user_messages("portal")) == 1
    assert InboxItem.objects.filter(tenant=tenant, thread="portal").count() == 1
    reply_url = first.json()["reply_url"]
    assert reply_url == f"/customers/{tenant.pk}/threads/portal/messages/{first.json()['id']}/reply"
    stream = client.get(reply_url)
    assert stream.status_code == 200 and stream["Content-Type"] == "text/event-stream"
    raw = b"".join(stream.streaming_content)
    assert raw.startswith(b"retry: 1000\n\n")
    events = sse_events(raw)
    assert [e for e, _ in events if e == "delta"] and events[-1][0] == "end"
    assert json.loads(next(d for e, d in events if e == "reply"))["content"] == "echo: where is my order"
    # A plain form post (no JavaScript) sends too and comes back to the page.
    form = client.post(url, {"content": "no script here", "idempotency_key": "form-key"})
    assert form.status_code == 302 and form["Location"].endswith(f"/customers/{tenant.pk}/#chat")
    assert len(stub.user_messages("portal")) == 2


def test_portal_refuses_bad_messages_with_the_reason(world):
    client = portal(world)
    url = f"/customers/{world['a'].pk}/threads/portal/messages"
    assert _send(client, url, "   ", "k-empty").status_code == 400
    assert _send(client, url, "x" * 32_001, "k-big").status_code == 400
    assert client.post(f"/customers/{world['a'].pk}/threads/bad%20name/messages", {"content": "hi"},
                       HTTP_ACCEPT="application/json").status_code == 400


def test_another_operators_user_gets_404_everywhere(world):
    tenant = world["a"]
    sent = _send(portal(world), f"/customers/{tenant.pk}/threads/portal/messages", "private", "k-p").json()
    bea = portal(world, "bea")
    for path in (f"/customers/{tenant.pk}/", f"/customers/{tenant.pk}/tasks/", f"/customers/{tenant.pk}/logs/",
                 f"/customers/{tenant.pk}/tasks/{sent['id']}/",
                 f"/customers/{tenant.pk}/threads/portal/messages/{sent['id']}/reply"):
        assert bea.get(path).status_code == 404, path
    assert bea.post(f"/customers/{tenant.pk}/threads/portal/messages", {"content": "x"}).status_code == 404
    # Nor can B's user read A's reply through B's own customer: the message is looked up under the tenant.
    own = world["b"]
    assert bea.get(f"/customers/{own.pk}/threads/portal/messages/{sent['id']}/reply").status_code == 404
    assert len(world["stub_a"].user_messages("portal")) == 1


def test_portal_tasks_task_detail_and_log(world):
    tenant, stub = world["a"], world["stub_a"]
    client = portal(world)
    sent = _send(client, f"/customers/{tenant.pk}/threads/portal/messages", "hello", "k-t").json()
    effect = stub.add_effect(sent["id"])
    tasks = client.get(f"/customers/{tenant.pk}/tasks/")
    assert tasks.status_code == 200 and f"/customers/{tenant.pk}/tasks/{sent['id']}/" in tasks.content.decode()
    assert client.get(f"/customers/{tenant.pk}/tasks/?status=nonsense").status_code == 200
    detail = client.get(f"/customers/{tenant.pk}/tasks/{sent['id']}/").content.decode()
    assert 'data-testid="task-status">done' in detail and effect in detail and "in_doubt" in detail
    assert "Decide" not in detail  # deciding is for staff
    assert client.get(f"/customers/{tenant.pk}/tasks/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert client.get(f"/customers/{tenant.pk}/tasks/not-a-task/").status_code == 404
    logs = client.get(f"/customers/{tenant.pk}/logs/?level=info&limit=500")
    assert logs.status_code == 200 and "hello from the stub" in logs.content.decode()


def test_instance_down_pages_say_so_and_a_message_waits_in_the_inbox(world):
    tenant, stub = world["a"], world["stub_a"]
    stub.down = True
    client = portal(world)
    for path in (f"/customers/{tenant.pk}/tasks/", f"/customers/{tenant.pk}/logs/"):
        page = client.get(path)
        assert page.status_code == 200 and "not reachable right now" in page.content.decode()
    sent = _send(client, f"/customers/{tenant.pk}/threads/portal/messages", "are you there", "k-down")
    assert sent.status_code == 202 and sent.json()["status"] == "pending"
    page = client.get(f"/customers/{tenant.pk}/").content.decode()
    assert "are you there" in page and "waiting for the agent" in page
    assert f'data-pending-reply="{sent.json()["reply_url"]}"' in page  # the page follows it when opened again


def test_the_branding_preview_shows_no_dead_buttons(world):
    OperatorMembership.objects.filter(user=world["users"]["ada"]).update(role="admin")
    html = portal(world).get("/branding/").content.decode()
    assert "Start a task" not in html and "View its tasks" not in html
    assert "Talk to the agent" in html


# --- dashboard


def test_dashboard_tenant_page_chat_tasks_and_logs(world):
    tenant = world["a"]
    staff = _client(world["users"]["staff"])
    page = staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert 'data-testid="chat"' in page and f"/dashboard/tenants/{tenant.pk}/tasks/" in page
    sent = _send(staff, f"/dashboard/tenants/{tenant.pk}/threads/portal/messages", "staff here", "k-s")
    assert sent.status_code == 201
    assert b"echo: staff here" in b"".join(staff.get(sent.json()["reply_url"]).streaming_content)
    assert staff.get(f"/dashboard/tenants/{tenant.pk}/tasks/").status_code == 200
    assert staff.get(f"/dashboard/tenants/{tenant.pk}/tasks/{sent.json()['id']}/").status_code == 200
    assert b"hello from the stub" in staff.get(f"/dashboard/tenants/{tenant.pk}/logs/").content


def test_viewer_reads_but_cannot_talk_or_decide(world):
    tenant, stub = world["a"], world["stub_a"]
    effect = stub.add_effect("00000000-0000-0000-0000-000000000001")
    viewer = _client(world["users"]["viewer"])
    page = viewer.get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert 'data-testid="chat"' in page and "data-chat-form" not in page
    assert viewer.get(f"/dashboard/tenants/{tenant.pk}/tasks/").status_code == 200
    assert _send(viewer, f"/dashboard/tenants/{tenant.pk}/threads/portal/messages", "hi", "k-v").status_code == 403
    decide = f"/dashboard/tenants/{tenant.pk}/effects/{effect}/decide/"
    assert viewer.get(decide).status_code == 403
    assert viewer.post(decide, {"decision": "performed"}).status_code == 403
    assert stub.effects[effect]["state"] == "in_doubt"
    assert stub.user_messages("portal") == []


def test_staff_decides_an_effect_once_and_it_is_audited(world):
    tenant, stub = world["a"], world["stub_a"]
    effect = stub.add_effect("00000000-0000-0000-0000-000000000002")
    staff = _client(world["users"]["staff"])
    decide = f"/dashboard/tenants/{tenant.pk}/effects/{effect}/decide/"
    form = staff.get(decide)
    assert form.status_code == 200 and b"payments.charge" in form.content
    assert staff.post(decide, {"decision": "performed", "result": "{not json"}).status_code == 400
    body = {"decision": "performed", "result": '{"id": "ch_1"}', "note": "seen in the provider",
            "idempotency_key": "d1", "next": "https://evil.example/"}
    done = staff.post(decide, body)
    assert done.status_code == 302 and done["Location"] == "/dashboard/effects/"  # never an outside redirect
    assert stub.effects[effect]["state"] == "committed" and stub.effects[effect]["result"] == {"id": "ch_1"}
    assert staff.post(decide, body).status_code == 302  # the same submission again: the first answer
    assert AuditLog.objects.filter(action="effect.decide", tenant=tenant).count() == 1
    assert staff.get(f"/dashboard/tenants/{tenant.pk}/effects/bad%20key/decide/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_queue_lists_effects_in_doubt_across_tenants_and_caps_the_fan_out(world):
    a, b = world["a"], world["b"]
    key_a = world["stub_a"].add_effect("00000000-0000-0000-0000-00000000000a")
    key_b = world["stub_b"].add_effect("00000000-0000-0000-0000-00000000000b", state="blocked")
    world["stub_b"].add_effect("00000000-0000-0000-0000-00000000000c", state="committed")
    staff = _client(world["users"]["staff"])
    overview = staff.get("/dashboard/").content.decode()
    assert 'href="/dashboard/effects/"' in overview
    page = staff.get("/dashboard/effects/").content.decode()
    assert key_a in page and key_b in page and "00000000000c" not in page
    assert f"/dashboard/tenants/{a.pk}/effects/{key_a}/decide/" in page
    assert "asks at most 20 instances per load" in page
    viewer_page = _client(world["users"]["viewer"]).get("/dashboard/effects/").content.decode()
    assert key_a in viewer_page and "/decide/" not in viewer_page
    first = effect_queue(cap=1)
    assert (len(first.asked), first.total_tenants, first.has_next) == (1, 2, True)
    second = effect_queue(cap=1, page=2)
    assert {first.asked[0].pk, second.asked[0].pk} == {a.pk, b.pk} and not second.has_next
    world["stub_b"].stop()
    partial = effect_queue()
    assert [r["effect"]["key"] for r in partial.rows] == [key_a]
    assert [t.pk for t, _ in partial.unanswered] == [b.pk]


# --- the log screen (newest first, search, level, pages, task links, follow) and a blocked task's levers

TASK_1 = "6f1c9a62-0000-4000-8000-0000000000a1"


def _fill_log(stub, n: int = 120, start: float = 1_780_000_000.0) -> None:  # type: ignore[no-untyped-def]
    """`n` records one second apart; every tenth an error, the 7th names TASK_1, the 8th a task id that is not one."""
    stub.log_records = [{"ts": start + i, "level": "error" if i % 10 == 9 else "info", "logger": "agent.host",
                         "msg": f"record {i:03d}" + (" needle" if i in (5, 55) else ""),
                         **({"event": "task_outcome", "task_id": TASK_1} if i == 7 else {}),
                         **({"task_id": "../../admin"} if i == 8 else {})} for i in range(n)]


def _rows(html: str) -> list[str]:
    return re.findall(r"record (\d{3})", html)


def test_log_screen_is_newest_first_searchable_filtered_paged_and_links_tasks(world):
    tenant, stub = world["a"], world["stub_a"]
    _fill_log(stub)
    client = portal(world)
    base = f"/customers/{tenant.pk}/logs/"
    first = client.get(base).content.decode()
    assert _rows(first)[:3] == ["119", "118", "117"] and len(_rows(first)) == 50
    assert "Page 1 of 3 (120 in all)" in first and "last 120 records" in first
    last = client.get(base + "?page=3").content.decode()
    assert _rows(last)[-3:] == ["002", "001", "000"] and len(_rows(last)) == 20
    assert f'href="/customers/{tenant.pk}/tasks/{TASK_1}/"' in last  # the record naming a task links to it
    assert last.count('data-testid="log-task"') == 1  # a task_id that is no task id gets no link
    assert _rows(client.get(base + "?q=NEEDLE").content.decode()) == ["055", "005"]
    assert _rows(client.get(base + f"?q={TASK_1[-12:]}").content.decode()) == ["007"]  # extra fields are searched
    errors = client.get(base + "?level=error").content.decode()
    assert _rows(errors)[:2] == ["119", "109"] and len(_rows(errors)) == 12
    assert "No record matches." in client.get(base + "?q=nowhere-at-all").content.decode()
    assert client.get(base + "?level=bogus&page=zzz").status_code == 200  # bad input is ignored, not a 500
    assert 'data-testid="log-poll"' in client.get(base + "?follow=1").content.decode()
    assert 'data-testid="log-poll"' not in client.get(base + "?follow=1&page=2").content.decode()  # follows the top
    staff = _client(world["users"]["staff"]).get(f"/dashboard/tenants/{tenant.pk}/logs/?q=needle").content.decode()
    assert _rows(staff) == ["055", "005"]
    assert f'href="/dashboard/tenants/{tenant.pk}/tasks/{TASK_1}/"' in _client(world["users"]["staff"]).get(
        f"/dashboard/tenants/{tenant.pk}/logs/?page=3").content.decode()


def test_follow_mode_polls_for_the_records_after_the_newest_shown(world):
    tenant, stub = world["a"], world["stub_a"]
    _fill_log(stub, n=3)
    client = portal(world)
    page = client.get(f"/customers/{tenant.pk}/logs/?follow=1&q=record").content.decode()
    poll = re.search(r'data-testid="log-poll" hx-get="([^"]+)" hx-trigger="every 3s" hx-swap="outerHTML"', page)
    assert poll and "<script>" not in page, page  # htmx polling: no inline script for the CSP to refuse
    url = html.unescape(poll.group(1))
    assert "since=1780000002.0" in url and "q=record" in url
    assert _rows(client.get(url).content.decode()) == []  # nothing new yet: only the next poll row
    stub.log_records += [{"ts": 1_780_000_003.5, "level": "info", "msg": "record 900"},
                         {"ts": 1_780_000_004.0, "level": "info", "msg": "unrelated"},
                         {"ts": 1_780_000_004.5, "level": "warning", "msg": "record 901", "task_id": TASK_1}]
    answer = client.get(url).content.decode()
    assert _rows(answer) == ["901", "900"] and "unrelated" not in answer  # newest first, the search still applies
    assert f"/customers/{tenant.pk}/tasks/{TASK_1}/" in answer
    assert answer.lstrip().startswith('<tr hidden id="log-poll"') and "since=1780000004.5" in answer
    assert "<html" not in answer  # a fragment swapped in place of the poll row


def test_another_operator_cannot_read_or_follow_a_customers_log(world):
    tenant_a, tenant_b = world["a"], world["b"]
    _fill_log(world["stub_a"], n=5)
    world["stub_b"].log_records = [{"ts": 1_780_000_000.0, "level": "info", "msg": "own record of b"}]
    bea = portal(world, "bea")
    for query in ("", "?follow=1", "?since=0", "?q=record&page=1"):
        assert bea.get(f"/customers/{tenant_a.pk}/logs/{query}").status_code == 404, query
    own = bea.get(f"/customers/{tenant_b.pk}/logs/?since=0").content.decode()
    assert "own record of b" in own and _rows(own) == []
    # A's host does not serve B's customer either, even to A's own member.
    assert portal(world).get(f"/customers/{tenant_b.pk}/logs/?since=0").status_code == 404


def _blocked_task(stub) -> str:  # type: ignore[no-untyped-def]
    stub.tasks[TASK_1] = {"id": TASK_1, "kind": "demo", "status": "blocked", "blocked_reason": "credential_unavailable",
                          "blocked_detail": "the vault has no credential 'stripe' (vault said 404)",
                          "created_at": "2026-12-05T10:00:00Z", "updated_at": "2026-12-05T10:00:01Z"}
    return TASK_1


def test_a_blocked_task_says_why_in_words_and_the_portal_cancels_it_once_audited(world):
    from instances.blocked_reasons import BLOCKED_REASONS

    tenant, stub = world["a"], world["stub_a"]
    task_id = _blocked_task(stub)
    client = portal(world)
    page = client.get(f"/customers/{tenant.pk}/tasks/{task_id}/").content.decode()
    words = BLOCKED_REASONS["credential_unavailable"]
    reason = re.search(r'data-testid="blocked-reason-text">([^<]*)<', page)
    assert reason and html.unescape(reason.group(1)) == words.text
    assert html.escape(words.action) in page and "vault said 404" in page
    assert 'data-testid="task-retry"' in page and 'data-testid="task-cancel"' in page
    cancel = f"/customers/{tenant.pk}/tasks/{task_id}/cancel"
    # The task page's Cancel is a GET to a confirm page; neither it nor a POST without the confirm field cancels.
    assert f'<form method="get" action="{cancel}" data-testid="task-cancel"' in page
    for asked in (client.get(cancel), client.post(cancel, {"idempotency_key": "first-click"})):
        text = asked.content.decode()
        assert asked.status_code == 200 and 'data-testid="task-cancel-confirm"' in text
        assert "cannot be retried afterwards" in text and "committed" in text and "csrfmiddlewaretoken" in text
        assert stub.tasks[task_id]["status"] == "blocked"
    assert not AuditLog.objects.filter(action="task.cancel", tenant=tenant).exists()
    key = re.search(r'data-testid="task-cancel-confirm-form".*?name="idempotency_key" value="([0-9a-f]+)"', text, re.S)
    assert key and 'name="confirm" value="yes"' in text
    # The confirm without its CSRF token is refused (the session's client enforces it here).
    strict = Client(HTTP_HOST=HOST_A, enforce_csrf_checks=True)
    strict.force_login(world["users"]["ada"])
    assert strict.post(cancel, {"confirm": "yes", "idempotency_key": key.group(1)}).status_code == 403
    assert stub.tasks[task_id]["status"] == "blocked"
    done = client.post(cancel, {"confirm": "yes", "idempotency_key": key.group(1)})
    assert done.status_code == 302 and done["Location"] == f"/customers/{tenant.pk}/tasks/{task_id}/"
    assert stub.tasks[task_id]["status"] == "cancelled"
    assert client.post(cancel, {"confirm": "yes", "idempotency_key": key.group(1)}).status_code == 302  # one cancel
    audit = AuditLog.objects.filter(action="task.cancel", tenant=tenant)
    assert audit.count() == 1 and audit.get().actor_label == "ada via scr-a portal"
    assert audit.get().data["task"] == task_id
    after = client.get(f"/customers/{tenant.pk}/tasks/{task_id}/").content.decode()
    assert 'data-testid="task-cancel"' not in after and 'data-testid="task-retry"' not in after  # it has ended
    # A viewer sees the words without the buttons and cannot post either lever.
    OperatorMembership.objects.filter(user=world["users"]["ada"]).update(role="viewer")
    _blocked_task(stub)
    viewer_page = client.get(f"/customers/{tenant.pk}/tasks/{task_id}/").content.decode()
    assert 'data-testid="blocked-reason-text"' in viewer_page and 'data-testid="task-cancel"' not in viewer_page
    assert client.post(cancel, {"confirm": "yes", "idempotency_key": "v"}).status_code == 403
    assert client.get(cancel).status_code == 403  # not even the confirm page
    assert stub.tasks[task_id]["status"] == "blocked"


def test_staff_retry_and_cancel_a_blocked_task_from_the_dashboard(world):
    tenant, stub = world["a"], world["stub_a"]
    task_id = _blocked_task(stub)
    base = f"/dashboard/tenants/{tenant.pk}/tasks/{task_id}"
    viewer = _client(world["users"]["viewer"])
    seen = viewer.get(base + "/").content.decode()
    assert "asked the vault for a credential" in seen and 'data-testid="task-cancel"' not in seen
    assert viewer.post(base + "/cancel", {"confirm": "yes", "idempotency_key": "v"}).status_code == 403
    assert viewer.get(base + "/cancel").status_code == 403
    staff = _client(world["users"]["staff"])
    page = staff.get(base + "/").content.decode()
    assert 'data-testid="task-retry"' in page and 'data-testid="task-cancel"' in page
    assert staff.post(base + "/retry", {"idempotency_key": "r1"}).status_code == 302
    assert stub.retries == [task_id] and stub.tasks[task_id]["status"] == "pending"
    pending = staff.get(base + "/").content.decode()
    assert 'data-testid="task-retry"' not in pending and 'data-testid="task-cancel"' in pending  # still cancellable
    confirm = staff.get(base + "/cancel")  # the button's GET: the confirm page, nothing cancelled
    assert confirm.status_code == 200 and "cannot be retried afterwards" in confirm.content.decode()
    assert staff.post(base + "/cancel", {"idempotency_key": "c0"}).status_code == 200  # no confirm field: asks
    assert stub.tasks[task_id]["status"] == "pending"
    assert staff.post(base + "/cancel", {"confirm": "yes", "idempotency_key": "c1"}).status_code == 302
    assert stub.tasks[task_id]["status"] == "cancelled"
    refused = staff.post(base + "/cancel", {"confirm": "yes", "idempotency_key": "c2"}, follow=True).content.decode()
    assert "Not cancelled:" in refused and "already cancelled" in refused  # the instance's 409, said on the page
    actions = list(AuditLog.objects.filter(tenant=tenant, action__startswith="task.").values_list("action", flat=True)
                   .order_by("id"))
    assert actions == ["task.retry", "task.cancel", "task.cancel"]
