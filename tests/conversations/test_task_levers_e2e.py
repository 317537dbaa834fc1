"""Levers on a stuck task end to end: a real agent-host onboarded by a real Celery worker, its heartbeats and
credential reads served by a live control plane (pytest-django's live server), the operator API in front.

A poison task shows its cause in words and the agent's file:line; after the cause is removed, the API's Retry
finishes it from its checkpoint with its email sent once; a retry of the done task is 409. A task blocked on a
credential the vault does not hold resumes by itself within one heartbeat of the credential being stored through
the vault API.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.conf import settings

from instances.blocked_reasons import BLOCKED_REASONS
from instances.client import forget_tenant
from tests.conftest import SESSION_TMP, kill_session_instances, onboard_ready, wait_for
from tests.conversation_helpers import post_json
from tests.vault.test_vault_helpers import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT_S = 1.0


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    extra = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
             "AGENT_SMTP_URL": sinks["smtp"]}
    settings.INSTANCE_EXTRA_ENV = dict(extra)
    worker = worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url,
                            INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    yield worker
    kill_session_instances()


def _task(api, base: str, task_id: str) -> dict:  # type: ignore[no-untyped-def]
    resp = api.get(f"{base}/{task_id}")
    return resp.json() if resp.status_code == 200 else {}


def _emails(subject: str) -> int:
    log = SESSION_TMP / "smtp.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if line and subject in json.loads(line).get("subject", ""))


def test_retry_after_the_fix_and_a_credential_stored_through_the_vault_resumes_the_task(api, fleet):
    tenant = onboard_ready(api.operator, "levers-e2e")
    forget_tenant(str(tenant.pk))
    base = f"/api/v1/tenants/{tenant.pk}/tasks"
    volume = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name

    created = post_json(api, base, {"kind": "fixable", "params": {"fixed_file": "fixed"}})
    assert created.status_code in (201, 202), created.content
    task_id = created.json()["inbox"]["id"]
    wait_for(lambda: _task(api, base, task_id).get("task", {}).get("status") == "blocked", timeout=60,
             what="poison")
    detail = _task(api, base, task_id)
    task = detail["task"]
    assert task["blocked_reason"] == "poison_step" and task["retryable"] is True
    assert task["blocked_reason_text"] == BLOCKED_REASONS["poison_step"].text
    charge = next(s for s in detail["steps"] if s["name"] == "charge")
    assert charge["error"].startswith("ValueError: too many values to unpack")
    assert "(tests/runtime/agents.py:" in charge["error"] and charge["error"].endswith(" in charge)")
    assert str(volume) not in json.dumps(detail)

    (volume / "fixed").write_text("the cause is removed")
    retried = api.post(f"{base}/{task_id}/retry")
    assert retried.status_code == 200, retried.content
    wait_for(lambda: _task(api, base, task_id).get("task", {}).get("status") == "done", timeout=60, what="done")
    detail = _task(api, base, task_id)
    assert detail["result"] == "closed" and detail["task"]["blocked_reason_text"] is None
    assert [e["event"] for e in detail["events"] if e["step"] == "notify_first"] == ["start", "done"]
    assert _emails(f"refund {task_id}") == 1
    assert assert_problem(api.post(f"{base}/{task_id}/retry"), 409)["code"] == "conflict"

    keyed = post_json(api, base, {"kind": "needs_key"}).json()["inbox"]["id"]
    wait_for(lambda: _task(api, base, keyed).get("task", {}).get("status") == "blocked", timeout=60,
             what="credential block")
    task = _task(api, base, keyed)["task"]
    assert task["blocked_reason"] == "credential_unavailable" and "'openai'" in task["blocked_detail"]
    assert task["blocked_action"] == BLOCKED_REASONS["credential_unavailable"].action
    stored = api.put(f"/api/v1/tenants/{tenant.pk}/credentials/openai", data=json.dumps({"value": "sk-e2e-value"}),
                     content_type="application/json")
    assert stored.status_code == 201, stored.content
    t0 = time.monotonic()
    wait_for(lambda: _task(api, base, keyed).get("task", {}).get("status") == "done", timeout=30, what="resumed",
             interval=0.05)
    resumed_s = time.monotonic() - t0
    assert resumed_s < HEARTBEAT_S + 2.0, resumed_s  # one heartbeat, plus the step and this loop's reads
    assert "sk-e2e-value" not in json.dumps(_task(api, base, keyed))
