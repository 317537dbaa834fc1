"""Usage under SIGKILLs (issue 37): 50 tasks on a real instance whose agent-host is killed again and again, and the
collected token and task counts are exact: no model call counted twice, none lost.

One tenant onboarded through the real workflow on a real Celery worker, which is therefore its agent-host's parent
and starts a recovery the moment the host dies (``LOCAL_EXIT_NOTICE``, provisioning/recovery/exit_notice.py). Its agent
(``chaos-metered``, tests/runtime/agents.py) reports two model calls per task with ``ctx.usage(..., key=...)``;
the first step holds on after its report, and that is where most SIGKILLs land: the recovered host runs the step
again, which reports the same call again, the case the key exists for. Other kills land between tasks, and tasks
are submitted through the API while the host is dead (they wait in the inbox, delivered on its first heartbeat).
Usage is collected between the kills, once while nothing runs, and at the end twice; every intermediate figure is
at most the final one, and the final one is exactly what the test submitted.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC
from typing import Any

import psycopg
import pytest
from django.utils import timezone
from psycopg import sql

from instances.client import forget_tenant
from provisioning.choices import RecoveryOutcome
from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.fleet.instances import instance_task_summary
from provisioning.models import RecoveryEvent
from tenants.models import Tenant
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.conversation_helpers import post_json
from tests.provisioning.test_recovery import WORKER_ENV, _host_pids
from usage.models import UsageDay
from usage.services import usage_collect, usage_collect_fleet

TASKS = 50
KILLS = 8  # one per batch of tasks; the last batch runs undisturbed
HOLD_S = 1.5  # how long the first step of a batch's target task runs on after its report: the SIGKILL's window

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    """A worker with the exit notice on (its children are recovered the moment they die) and fast recovery."""
    extra = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_HEARTBEAT_INTERVAL_S": "0.3",
             "AGENT_SMTP_URL": sinks["smtp"]}
    settings.INSTANCE_EXTRA_ENV = dict(extra)
    settings.LOCAL_EXIT_NOTICE = True  # read by subprocess_env: the worker's own setting
    worker = worker_factory(**WORKER_ENV, CONTROL_PLANE_INTERNAL_URL=live_server.url,
                            INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    yield worker
    worker.stop()  # first: with the exit notice on, the worker would recover the instances killed below
    kill_session_instances()


def _expected(n: int) -> dict[str, tuple[int, int]]:
    """The tokens task ``n`` reports, per model (the agent's formulas)."""
    return {"m-chaos-large": (1000 + n, 100 + n), "m-chaos-small": (10 + n, n)}


def _rows(tenant: Tenant, query: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(tenant.resource_name)), args).fetchall()


def _reported_not_done(tenant: Tenant, task_ids: set[str]) -> str | None:
    """A task of ``task_ids`` whose first step has reported its model call and not finished: mid-step."""
    rows = _rows(tenant, "SELECT u.task_id::text FROM {s}.model_usage u WHERE u.step = 'plan' AND NOT EXISTS ("
                         "SELECT 1 FROM {s}.step_events e WHERE e.task_id = u.task_id AND e.step = 'plan'"
                         " AND e.event = 'done')")
    return next((r[0] for r in rows if r[0] in task_ids), None)


def _task_ids(tenant: Tenant, ns: list[int]) -> set[str]:
    rows = _rows(tenant, "SELECT id::text, (params->>'n')::int FROM {s}.tasks")
    return {tid for tid, n in rows if n in ns}


def _totals(rows: list[UsageDay]) -> tuple[int, int, int, int, dict[str, dict[str, int]]]:
    by_model: dict[str, dict[str, int]] = {}
    for row in rows:
        for model, tokens in row.tokens_by_model.items():
            into = by_model.setdefault(model, {"input": 0, "output": 0})
            into["input"] += tokens["input"]
            into["output"] += tokens["output"]
    return (sum(r.tasks_submitted for r in rows), sum(r.tasks_done for r in rows),
            sum(r.input_tokens for r in rows), sum(r.output_tokens for r in rows), by_model)


def _done(tenant: Tenant) -> int:
    return int(instance_task_summary(tenant=tenant)["tasks"].get("done", 0))


def test_fifty_tasks_with_sigkills_between_and_mid_step_are_metered_exactly(api, fleet):
    started = time.monotonic()
    tenant = onboard_ready(api.operator, "meter-chaos")
    forget_tenant(str(tenant.pk))
    onboarded_s = time.monotonic() - started

    expected_by_model: dict[str, dict[str, int]] = {}
    for n in range(1, TASKS + 1):
        for model, (i, o) in _expected(n).items():
            into = expected_by_model.setdefault(model, {"input": 0, "output": 0})
            into["input"] += i
            into["output"] += o
    expected_in = sum(m["input"] for m in expected_by_model.values())
    expected_out = sum(m["output"] for m in expected_by_model.values())

    batches = [list(range(1 + b * TASKS // (KILLS + 1), 1 + (b + 1) * TASKS // (KILLS + 1))) for b in range(KILLS + 1)]
    assert sum(map(len, batches)) == TASKS
    queued = 0  # submissions answered 202: the host was dead, the inbox kept them
    kills: list[dict[str, object]] = []
    seen: list[tuple[int, int, int, int, dict[str, dict[str, int]]]] = []
    collected_while_dead = 0

    def collect() -> None:
        seen.append(_totals(usage_collect(tenant=tenant)))

    def recovered() -> None:
        """The last kill's recovery is over (one succeeded recovery per kill) and a host runs again."""
        wait_for(lambda: RecoveryEvent.objects.filter(tenant=tenant, outcome=RecoveryOutcome.SUCCEEDED).count()
                 == len(kills) and len(_host_pids(tenant)) == 1, timeout=60, what="recovered")

    for b, batch in enumerate(batches):
        target = batch[-1] if b < KILLS and b % 4 != 3 else None  # every fourth kill lands between tasks instead
        if b % 2 == 0:
            recovered()  # half the batches go to a running host, the others into the inbox of a dead one
        for n in batch:
            params: dict[str, object] = {"n": n, "hold_s": HOLD_S if n == target else 0}
            created = post_json(api, f"/api/v1/tenants/{tenant.pk}/tasks", {"kind": "chaos-metered", "params": params})
            assert created.status_code in (201, 202), created.content
            queued += created.status_code == 202
        if b == KILLS:
            break
        recovered()
        if target is not None:
            ids = wait_for(lambda: _task_ids(tenant, [target]), timeout=60, what="the target task delivered")
            assert isinstance(ids, set)
            victim = wait_for(lambda: _reported_not_done(tenant, ids), timeout=60, interval=0.02,
                              what="the target task's first step reported and still running")
        else:
            wait_for(lambda: _done(tenant) == batch[-1], timeout=60, what="the batch done")
            victim = None
        [pid] = _host_pids(tenant)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        if b % 2 == 0:  # collected at once: the new host takes a second or more to boot
            collect()
            collected_while_dead += not _host_pids(tenant)
        kills.append({"pid": pid, "victim": victim, "at": killed_at})

    wait_for(lambda: _done(tenant) == TASKS, timeout=120, what=f"{TASKS} tasks done")
    collect()
    runs_s = time.monotonic() - started - onboarded_s

    events = list(RecoveryEvent.objects.filter(tenant=tenant).order_by("id"))
    assert [e.outcome for e in events] == [RecoveryOutcome.SUCCEEDED] * KILLS, [(e.outcome, e.detail) for e in events]
    resumed = [(e.resumed_at - e.detected_at).total_seconds() for e in events if e.resumed_at]
    mid_step = [k for k in kills if k["victim"]]
    # Each mid-step victim's first step ran again after its report: the report the key must not count twice.
    for kill in mid_step:
        starts = _rows(tenant, "SELECT count(*) FROM {s}.step_events WHERE task_id = %s AND step = 'plan'"
                               " AND event = 'start'", kill["victim"])
        assert starts[0][0] >= 2, kill
    summary = instance_task_summary(tenant=tenant)["tasks"]
    assert summary == {"done": TASKS}, summary

    rows = usage_collect(tenant=tenant)
    submitted, done, tokens_in, tokens_out, by_model = _totals(rows)
    assert (submitted, done) == (TASKS, TASKS)
    assert by_model == expected_by_model
    assert (tokens_in, tokens_out) == (expected_in, expected_out)
    for earlier in seen:  # never more than the truth on the way, whenever it was collected
        assert earlier[0] <= TASKS and earlier[1] <= TASKS and earlier[2] <= expected_in and earlier[3] <= expected_out
    assert [s[2] for s in seen] == sorted(s[2] for s in seen)
    assert collected_while_dead >= 1, "no collection ran while the host was dead"
    assert 0 < queued < TASKS, queued  # some submissions waited in the inbox, the others went straight in
    before = {r.day: (r.tasks_submitted, r.tasks_done, r.input_tokens, r.output_tokens, r.tokens_by_model)
              for r in UsageDay.objects.filter(tenant=tenant)}
    assert usage_collect_fleet() == 1 and usage_collect_fleet() == 1
    after = {r.day: (r.tasks_submitted, r.tasks_done, r.input_tokens, r.output_tokens, r.tokens_by_model)
             for r in UsageDay.objects.filter(tenant=tenant)}
    assert after == before and timezone.now().astimezone(UTC).date() in after

    print(f"\nusage chaos: {len(kills)} SIGKILLs ({len(mid_step)} mid-step, {len(kills) - len(mid_step)} between "
          f"tasks), {queued} submissions queued while dead, {len(seen)} collections ({collected_while_dead} while "
          f"dead); onboarding {onboarded_s:.1f} s, tasks and kills {runs_s:.1f} s; detection to resumed "
          f"{min(resumed):.2f}-{max(resumed):.2f} s; {TASKS} tasks, {tokens_in} input and {tokens_out} output tokens")
