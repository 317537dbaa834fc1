"""Thread policies against a real agent-host (issue 35): what a message does to its thread's run still going.

Real parts only: a tenant onboarded by a real Celery worker, its instance running the `payer` agent
(tests/runtime/agents.py: pays when asked, holds while a file exists in its volume, then replies with the user
messages its thread's window holds), and the payment peer with Stripe's Idempotency-Key semantics, where every
charge is counted. Each policy is exercised with a run held mid-task that has committed a payment before the second
message arrives, and the peer must show exactly that one charge (for `rollback` over a run without effects, the
thread's earlier payment stays the only one).
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from conversations.models import InboxItem, ThreadSetting
from provisioning.drivers.local_process import live_host_pid
from provisioning.fleet.instances import instance_start
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.conversation_helpers import post_json

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_NAME = "payer-hold"  # relative: the instance resolves it in its own volume (see CHAT_HOLD_NAME)


@pytest.fixture
def fleet(sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    # No commas in any value: INSTANCE_EXTRA_ENV is a k=v,k=v list.
    extra = {"AGENT_APP": "tests.runtime.agents:THREAD_AGENTS",
             "AGENT_CONFIG": json.dumps({"payer_hold_file": HOLD_NAME}),
             "AGENT_PAYMENTS_URL": sinks["payments"], "AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S": "0"}
    settings.INSTANCE_EXTRA_ENV = dict(extra)
    worker = worker_factory(INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    yield {"worker": worker, "payments": sinks["payments"]}
    kill_session_instances()


def _hold(tenant: Tenant) -> None:
    (Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / HOLD_NAME).write_text("hold")


def _release(tenant: Tenant) -> None:
    (Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / HOLD_NAME).unlink(missing_ok=True)


def _charges(payments: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{payments}/stats", timeout=5) as resp:
        return list(json.loads(resp.read())["charge_list"])


def _peer(payments: str, before: int) -> list[tuple[int, str]]:
    """(amount, Idempotency-Key) of each charge the payment peer took since `before` charges."""
    return [(c["amount"], c["idempotency_key"]) for c in _charges(payments)[before:]]


def _paid(api, tenant: Tenant, task_id: str) -> str:  # type: ignore[no-untyped-def]
    """The key of the task's one payment, committed (the running task paid before the second message)."""
    paid = [e for e in _task(api, tenant, task_id)["effects"] if e["effect"] == "payment"]
    assert [e["state"] for e in paid] == ["committed"], paid
    return str(paid[0]["key"])


def _messages(tenant: Tenant, thread: str) -> str:
    return f"/api/v1/tenants/{tenant.pk}/threads/{thread}/messages"


def _task(api, tenant: Tenant, task_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    resp = api.get(f"/api/v1/tenants/{tenant.pk}/tasks/{task_id}")
    assert resp.status_code == 200, resp.content
    return dict(resp.json())


def _status(api, tenant: Tenant, task_id: str) -> str:  # type: ignore[no-untyped-def]
    return str(_task(api, tenant, task_id)["task"]["status"])


def _step(api, tenant: Tenant, task_id: str, name: str) -> str:  # type: ignore[no-untyped-def]
    steps = {s["name"]: s["status"] for s in _task(api, tenant, task_id)["steps"]}
    return str(steps.get(name, "missing"))


def _send(api, tenant: Tenant, thread: str, content: str, **body: str):  # type: ignore[no-untyped-def]
    return post_json(api, _messages(tenant, thread), {"content": content, **body})


def _holding(api, tenant: Tenant, thread: str, content: str) -> str:  # type: ignore[no-untyped-def]
    """Send `content` (enqueue) and wait until its run is inside the holding step, its payment (if any) done."""
    sent = _send(api, tenant, thread, content)
    assert sent.status_code == 201, sent.content
    task_id = str(sent.json()["task"]["id"])
    wait_for(lambda: _step(api, tenant, task_id, "hold_while_told") == "running", timeout=60, what="run holding")
    return task_id


def _replies(api, tenant: Tenant, thread: str) -> list[str]:  # type: ignore[no-untyped-def]
    page = api.get(_messages(tenant, thread) + "?limit=200").json()
    return [m["content"] for m in page["messages"] if m["role"] == "assistant"]


def test_reject_names_the_running_task_and_stores_nothing_until_the_run_ends(api, fleet):
    tenant = onboard_ready(api.operator, "policy-reject")
    put = api.put(f"/api/v1/tenants/{tenant.pk}/threads/t1", data=json.dumps({"policy": "reject"}),
                  content_type="application/json")
    assert put.status_code == 200 and put.json() == {"thread": "t1", "policy": "reject"}, put.content
    assert api.get(f"/api/v1/tenants/{tenant.pk}/threads/t1").json()["policy"] == "reject"
    assert AuditLog.objects.filter(tenant=tenant, action="conversation.thread_policy_set").count() == 1
    before = len(_charges(fleet["payments"]))
    _hold(tenant)
    first = _holding(api, tenant, "t1", "pay 400")
    paid = _paid(api, tenant, first)
    items = InboxItem.objects.filter(tenant=tenant).count()

    refused = _send(api, tenant, "t1", "too soon")
    assert refused.status_code == 409, refused.content
    problem = refused.json()
    assert refused["Content-Type"].startswith("application/problem+json")
    assert problem["code"] == "thread_busy" and problem["task"]["id"] == first, problem
    assert first in problem["detail"]
    assert InboxItem.objects.filter(tenant=tenant).count() == items  # decided before the inbox: nothing written

    # Another thread of the same tenant is not held up, and a request may override the thread's policy.
    assert _send(api, tenant, "t2", "other thread").status_code == 201
    queued = _send(api, tenant, "t1", "queued on purpose", policy="enqueue")
    assert queued.status_code == 201, queued.content
    queued_id = queued.json()["task"]["id"]
    assert queued.json()["task"]["status"] == "pending"

    _release(tenant)
    wait_for(lambda: _status(api, tenant, queued_id) == "done", timeout=60, what="queued run done")
    assert _status(api, tenant, first) == "done"
    after = _send(api, tenant, "t1", "now it is free")
    assert after.status_code == 201, after.content
    wait_for(lambda: _status(api, tenant, after.json()["task"]["id"]) == "done", timeout=60, what="third run done")
    assert _replies(api, tenant, "t1")[-1] == "seen: pay 400 | queued on purpose | now it is free"
    # At the peer: the running task's charge, once; neither the refusal nor the runs after it charged again.
    assert _peer(fleet["payments"], before) == [(400, paid)]


def test_enqueue_is_the_default_and_runs_the_next_message_after_the_first(api, fleet):
    tenant = onboard_ready(api.operator, "policy-enqueue")
    assert api.get(f"/api/v1/tenants/{tenant.pk}/threads/q").json() == {"thread": "q", "policy": "enqueue"}
    before = len(_charges(fleet["payments"]))
    _hold(tenant)
    first = _holding(api, tenant, "q", "pay 500")
    paid = _paid(api, tenant, first)
    second = _send(api, tenant, "q", "two")
    assert second.status_code == 201 and second.json()["halted"] == []
    second_id = second.json()["task"]["id"]
    assert _status(api, tenant, second_id) == "pending" and _status(api, tenant, first) == "running"
    _release(tenant)
    wait_for(lambda: _status(api, tenant, second_id) == "done", timeout=60, what="second run done")
    assert _status(api, tenant, first) == "done"
    # The second question was in the thread before the first run reached its answer: both runs see it.
    assert _replies(api, tenant, "q") == ["seen: pay 500 | two", "seen: pay 500 | two"]
    assert _peer(fleet["payments"], before) == [(500, paid)]  # the first run's charge, once
    assert not ThreadSetting.objects.filter(tenant=tenant).exists()


def test_interrupt_stops_the_run_at_its_step_boundary_and_keeps_its_payment(api, fleet):
    tenant = onboard_ready(api.operator, "policy-interrupt")
    before = len(_charges(fleet["payments"]))
    _hold(tenant)
    first = _holding(api, tenant, "i", "pay 700")
    paid = [e for e in _task(api, tenant, first)["effects"] if e["effect"] == "payment"]
    assert [e["state"] for e in paid] == ["committed"]

    second = _send(api, tenant, "i", "never mind", policy="interrupt")
    assert second.status_code == 201, second.content
    assert second.json()["halted"] == [{"id": first, "status": "interrupted"}]
    assert _status(api, tenant, first) == "interrupted"
    _release(tenant)  # the held step returns: the run stops at that boundary, the next message's run starts
    second_id = second.json()["task"]["id"]
    wait_for(lambda: _status(api, tenant, second_id) == "done", timeout=60, what="second run done")

    detail = _task(api, tenant, first)
    assert detail["task"]["status"] == "interrupted"
    steps = {s["name"]: s["status"] for s in detail["steps"]}
    # What it committed stays (the payment step, and the step under way when the message came); nothing after.
    assert steps == {"pay_if_asked": "done", "hold_while_told": "done", "answer_with_window": "pending"}, steps
    assert [e["state"] for e in detail["effects"] if e["effect"] == "payment"] == ["committed"]
    # At the peer: the first charge is there, once; nothing charged again.
    charges = _charges(fleet["payments"])[before:]
    assert [(c["amount"], c["idempotency_key"]) for c in charges] == [(700, paid[0]["key"])], charges
    # The interrupted run's question stays in the thread (it happened); only the second run replied.
    assert _replies(api, tenant, "i") == ["seen: pay 700 | never mind"]


def test_an_interrupt_survives_a_sigkill_before_the_boundary_and_the_payment_stays_one(api, fleet):
    """The run's end is a committed fact, not the worker's memory: killed inside the held step after the interrupt
    was accepted, the instance comes back without resuming the interrupted run, runs the new message, and the
    peer still has exactly the one charge."""
    tenant = onboard_ready(api.operator, "policy-interrupt-kill")
    before = len(_charges(fleet["payments"]))
    _hold(tenant)
    first = _holding(api, tenant, "k", "pay 1100")
    second = _send(api, tenant, "k", "forget it", policy="interrupt")
    assert second.status_code == 201 and second.json()["halted"] == [{"id": first, "status": "interrupted"}]
    spec = tenant_spec(tenant)
    os.kill(live_host_pid(spec), signal.SIGKILL)
    wait_for(lambda: live_host_pid(spec) is None, timeout=30, what="instance gone")
    _release(tenant)
    instance_start(tenant=tenant, actor=SYSTEM)
    second_id = second.json()["task"]["id"]
    wait_for(lambda: _status(api, tenant, second_id) == "done", timeout=90, what="second run done after restart")
    detail = _task(api, tenant, first)
    assert detail["task"]["status"] == "interrupted"
    assert {s["name"]: s["status"] for s in detail["steps"]}["answer_with_window"] == "pending"
    paid = [e for e in detail["effects"] if e["effect"] == "payment"]
    assert [e["state"] for e in paid] == ["committed"]
    charges = _charges(fleet["payments"])[before:]
    assert [(c["amount"], c["idempotency_key"]) for c in charges] == [(1100, paid[0]["key"])], charges
    assert _replies(api, tenant, "k") == ["seen: pay 1100 | forget it"]


def test_rollback_is_refused_past_a_committed_payment_and_the_run_goes_on(api, fleet):
    tenant = onboard_ready(api.operator, "policy-rollback-paid")
    api.put(f"/api/v1/tenants/{tenant.pk}/threads/r", data=json.dumps({"policy": "rollback"}),
            content_type="application/json")
    before = len(_charges(fleet["payments"]))
    _hold(tenant)
    first = _holding(api, tenant, "r", "pay 900")
    paid = [e for e in _task(api, tenant, first)["effects"] if e["effect"] == "payment"]

    refused = _send(api, tenant, "r", "undo that")  # the thread's policy: rollback
    assert refused.status_code == 409, refused.content
    problem = refused.json()
    assert problem["code"] == "rollback_refused", problem
    assert problem["effect"]["key"] == paid[0]["key"] and problem["effect"]["state"] == "committed"
    assert problem["task"]["id"] == first and paid[0]["key"] in problem["detail"]
    assert _status(api, tenant, first) == "running"  # untouched

    _release(tenant)
    wait_for(lambda: _status(api, tenant, first) == "done", timeout=60, what="paid run done")
    charges = _charges(fleet["payments"])[before:]
    assert [(c["amount"], c["idempotency_key"]) for c in charges] == [(900, paid[0]["key"])], charges
    assert _replies(api, tenant, "r") == ["seen: pay 900"]  # the refused message was never stored


def test_rollback_discards_a_run_without_effects_as_if_it_had_not_started(api, fleet):
    tenant = onboard_ready(api.operator, "policy-rollback")
    before = len(_charges(fleet["payments"]))
    settled = _send(api, tenant, "b", "pay 300")  # an earlier run, done: its payment is the thread's history
    assert settled.status_code == 201
    wait_for(lambda: _status(api, tenant, settled.json()["task"]["id"]) == "done", timeout=60, what="first run")
    _hold(tenant)
    discarded = _holding(api, tenant, "b", "think about it")
    workdir = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / "workspace" / "tasks" / discarded
    assert (workdir / "draft.txt").exists()

    second = _send(api, tenant, "b", "instead this", policy="rollback")
    assert second.status_code == 201, second.content
    assert second.json()["halted"] == [{"id": discarded, "status": "rolled_back"}]
    _release(tenant)
    second_id = second.json()["task"]["id"]
    wait_for(lambda: _status(api, tenant, second_id) == "done", timeout=60, what="second run done")

    assert _status(api, tenant, discarded) == "rolled_back"
    # The next run's window does not hold the discarded run's question; the earlier run's stays.
    assert _replies(api, tenant, "b") == ["seen: pay 300", "seen: pay 300 | instead this"]
    assert not workdir.exists()  # its uncommitted working files are gone
    charges = _charges(fleet["payments"])[before:]
    assert [c["amount"] for c in charges] == [300], charges
