"""A portal user chats with a customer's agent in headless Chromium; the agent is SIGKILLed mid-reply.

The instance is a real agent-host (onboarded by a real Celery worker) running the conversational test
agent ``chat`` (tests/runtime/agents.py): it streams "echo:" and the question's words, and holds after
the first word while the hold file exists. The page shows the partial answer, the host is killed, the
page's EventSource reconnects by itself, the instance is started again, the re-run step streams again and
the committed reply replaces the partial text. The tenant's own ``messages`` table then holds every
question and every answer exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect
from psycopg import sql

from instances.client import forget_tenant
from portal.models import OperatorMembership
from provisioning.drivers.local_process import live_host_pid
from provisioning.drivers.pg_admin import admin_connect
from provisioning.fleet.instances import instance_start
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create

from ..conftest import kill_session_instances, wait_for
from ..conversation_helpers import CHAT_HOLD_NAME, chat_hold, chat_release
from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-chat.localhost"
# No commas or '=' in the JSON: the worker reads INSTANCE_EXTRA_ENV as a k=v,k=v list.
EXTRA_ENV = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_CONFIG": json.dumps({"chat_hold_file": CHAT_HOLD_NAME})}


@pytest.fixture
def chat_fleet(worker_factory, settings):  # type: ignore[no-untyped-def]
    settings.INSTANCE_EXTRA_ENV = dict(EXTRA_ENV)  # this process starts the instance again after the kill
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in EXTRA_ENV.items()))
    chat_release()
    yield worker
    chat_release()
    kill_session_instances()  # the test's tenants are flushed from the database: their instances must go too


def _rows(tenant: Tenant, thread: str) -> list[tuple[str, str, dict]]:
    with admin_connect(autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT role, content, metadata FROM {}.messages WHERE thread = %s ORDER BY seq")
                            .format(sql.Identifier(tenant.resource_name)), (thread,)).fetchall()


def test_portal_chat_survives_a_sigkill_mid_reply(page, live_port, chat_fleet):
    operator = operator_create(slug="chatco", name="Chatco Agents", actor=SYSTEM, domains=[HOST])
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="initech", name="Initech", actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status in ("ready", "failed"), timeout=120, what="ready")
    tenant.refresh_from_db()
    assert tenant.status == "ready", (tenant.status_reason, chat_fleet.log()[-2000:])
    forget_tenant(str(tenant.pk))
    user = User.objects.create_user("peter", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="member")
    base = f"http://{HOST}:{live_port}"

    page.goto(f"{base}/customers/{tenant.pk}/")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.get_by_label("Username").fill("peter")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Talk to the agent")).to_be_visible()
    expect(page.get_by_test_id("chat-log")).to_contain_text("No messages yet")

    # 1. The agent streams its first word and holds: the page shows the partial answer.
    chat_hold()
    page.get_by_label("Message", exact=True).fill("where is my stapler")
    page.get_by_role("button", name="Send").click()
    log = page.get_by_test_id("chat-log")
    expect(log.locator(".msg.user")).to_have_count(1)
    partial = log.locator(".msg.assistant.streaming .text")
    expect(partial).to_have_text("echo:", timeout=30_000)
    screenshot(page, "portal-chat-streaming")

    # 2. SIGKILL the agent-host while the reply is being produced.
    spec = tenant_spec(tenant)
    pid = live_host_pid(spec)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: live_host_pid(spec) is None, timeout=30, what="instance gone")
    expect(page.get_by_test_id("chat-status")).to_contain_text("reconnecting", timeout=40_000)
    expect(log.locator(".msg.user")).to_have_text(re.compile("where is my stapler"))  # the question stays

    # 3. Start it again; the step re-runs, the page (still reconnecting by itself) gets the committed reply.
    chat_release()
    instance_start(tenant=tenant, actor=SYSTEM)
    committed = log.locator('.msg.assistant[data-committed="1"] .text')
    expect(committed).to_have_text("echo: where is my stapler", timeout=60_000)
    expect(page.get_by_test_id("chat-status")).to_have_text("")

    # 4. One more turn without a fault.
    page.get_by_label("Message", exact=True).fill("thanks a lot")
    page.get_by_role("button", name="Send").click()
    expect(committed).to_have_count(2, timeout=30_000)
    expect(committed.nth(1)).to_have_text("echo: thanks a lot")
    screenshot(page, "portal-chat")

    # Each question and each answer exactly once, in the tenant's own schema and on a fresh page.
    rows = _rows(tenant, "portal")
    assert [(r[0], r[1]) for r in rows] == [("user", "where is my stapler"), ("assistant", "echo: where is my stapler"),
                                            ("user", "thanks a lot"), ("assistant", "echo: thanks a lot")], rows
    questions = [r[2].get("message_id") for r in rows if r[0] == "user"]
    answers = [r[2].get("task") for r in rows if r[0] == "assistant"]
    assert len(set(questions)) == 2 and sorted(questions) == sorted(answers)
    page.reload()
    expect(log.locator(".msg.user")).to_have_count(2)
    expect(log.locator(".msg.assistant")).to_have_count(2)

    # The task list and the task's detail show the answered questions; the log viewer shows the host's log.
    page.get_by_role("link", name="Tasks").first.click()
    expect(page.get_by_test_id("task-list").locator("tbody tr")).to_have_count(2)
    page.get_by_test_id("task-list").locator("tbody tr a").first.click()
    expect(page.get_by_test_id("task-status")).to_have_text("done")
    expect(page.get_by_test_id("task-steps")).to_contain_text("answer")
    screenshot(page, "portal-task")
    page.goto(f"{base}/customers/{tenant.pk}/logs/")
    expect(page.get_by_test_id("log-records")).to_be_visible()
    screenshot(page, "portal-logs")
