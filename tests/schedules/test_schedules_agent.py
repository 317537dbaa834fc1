"""Issue 35, `ctx.schedule`: an agent's step schedules its own follow-up through the control plane's internal API,
recorded as an effect. A real agent-host (its tenant schema in a throw-away database, its instance token a real
one) talks to a live control plane; the step is SIGKILLed and replayed twenty times at the moments that matter
and the customer ends with exactly one schedule, counted in the control plane's table.

The kills: during boot and the step's start, and with the control plane unreachable (the intent is "unreached":
safe to make on the next boot); with the control plane's answer held (``SCHEDULES_PAUSE_AT=agent_answer``: the
schedule committed, the instance not told) on the call and then on the lookups the replays make, or with the
lookup unable to reach it (still in doubt); and after the effect committed, while the step is held. Then the step
is let go and the task ends with the one schedule's id.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from schedules.models import Schedule
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog
from tests.runtime.harness import HostRunner, Proc, TenantDB, admin_dsn, create_tenant_db, drop_tenant_db, make_env
from tests.vault.test_vault_helpers import make_instance, make_tenant

APP = "tests.runtime.effect_agents:AGENTS"
KILLS = 20


@pytest.fixture
def tenant_db() -> Iterator[TenantDB]:
    t = create_tenant_db(admin_dsn(), prefix="sched")
    try:
        yield t
    finally:
        drop_tenant_db(t, admin_dsn())


def _post(base: str, token: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(f"{base}/internal/v1/schedules", data=json.dumps(body).encode(), headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as answer:  # noqa: S310 - the live test server
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return int(refused.code), json.loads(refused.read() or b"{}")


def _get(base: str, token: str, path: str) -> int:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=20) as answer:  # noqa: S310 - the live test server
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


@pytest.mark.django_db(transaction=True)
def test_the_internal_api_makes_one_schedule_per_key_for_the_tokens_own_tenant(live_server, operator):
    tenant, other = make_tenant(operator), make_tenant(operator)
    token, other_token = make_instance(tenant), make_instance(other)
    body = {"in_s": 3600, "task": {"kind": "followup", "params": {"n": 1}}, "created_by_task": str(uuid.uuid4())}
    key = "eff-" + secrets.token_hex(20)
    assert _get(live_server.url, token, f"/internal/v1/schedules/by-key/{key}") == 404  # the lookup: absent
    # Eight racing first calls with one key, then a repeat with other arguments: one schedule, the first answer.
    answers: list[tuple[int, dict[str, Any]]] = []
    threads = [threading.Thread(target=lambda: answers.append(_post(live_server.url, token, body, key)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {code for code, _ in answers} <= {200, 201} and len({a["id"] for _, a in answers}) == 1
    again = _post(live_server.url, token, {**body, "in_s": 60}, key)
    assert again[0] == 200 and again[1]["id"] == answers[0][1]["id"]
    made = Schedule.objects.get(tenant=tenant)
    assert (made.idempotency_key, made.created_by_task, made.name) == (key, body["created_by_task"],
                                                                      f"agent-{key[-16:]}")
    assert made.at is not None and made.target == {"kind": "followup", "params": {"n": 1}}
    assert _get(live_server.url, token, f"/internal/v1/schedules/by-key/{key}") == 200
    assert AuditLog.objects.filter(action=AuditAction.SCHEDULE_CREATE, tenant=tenant).count() == 1
    # Another tenant's instance: its own namespace of keys; it neither sees nor reuses this schedule.
    assert _get(live_server.url, other_token, f"/internal/v1/schedules/by-key/{key}") == 404
    assert _post(live_server.url, other_token, body, key)[0] == 201
    assert Schedule.objects.filter(tenant=other).count() == 1 and Schedule.objects.filter(tenant=tenant).count() == 1
    # Refusals name what is wrong; no key, no schedule; an operator token is not an instance token.
    assert _post(live_server.url, token, body, None)[0] == 400
    bad = _post(live_server.url, token, {"cron": "61 * * * *", "task": {"kind": "x"}}, "eff-" + "1" * 40)
    assert bad[0] == 400 and bad[1]["field"] == "cron"
    assert _post(live_server.url, token, {**body, "at": "2030-01-01T00:00:00Z"}, "eff-" + "2" * 40)[0] == 400
    assert _get(live_server.url, "cpk_not_an_instance", f"/internal/v1/schedules/by-key/{key}") == 401


def _count(conn: psycopg.Connection, query: str, *params: Any) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def _wait(what: str, until: Any, host: Proc, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert host.alive(), f"agent-host exited while waiting for {what}:\n{host.output()[-3000:]}"
        assert time.monotonic() < deadline, f"never saw {what}:\n{host.output()[-3000:]}"
        time.sleep(0.01)


@pytest.mark.django_db(transaction=True)
def test_a_step_calling_ctx_schedule_killed_and_replayed_twenty_times_makes_one_schedule(
        live_server, operator, settings, tenant_db, tmp_path: Path) -> None:
    settings.CONTROLPLANE_FAULT_INJECTION = True  # the live server runs in this process: SCHEDULES_PAUSE_* apply
    settings.SCHEDULES_PAUSE_S = 0
    settings.SCHEDULES_PAUSE_AT = "agent_answer"
    tenant = make_tenant(operator)
    token = make_instance(tenant)
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_TENANT_ID=str(tenant.pk), AGENT_INSTANCE_TOKEN=token,
                   AGENT_CONTROL_PLANE_URL=live_server.url, AGENT_POLL_INTERVAL_S="0.02",
                   AGENT_EFFECT_RETRY_MAX_S="0.2", AGENT_HEARTBEAT_INTERVAL_S="5",
                   AGENT_STEP_MAX_ATTEMPTS="100")  # each kill mid-step is an attempt: not a poison step here
    conn = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    migrate(conn, tenant_db.schema)
    hold = tmp_path / "hold"
    hold.touch()
    tid = tasks.submit(conn, "follower", {"invoice": "inv-42", "hold_file": str(hold)})
    # As if an earlier attempt had recorded the configuration the task runs with (asked once per task, over the
    # internal API): the rounds below make the control plane unreachable, and only ctx.schedule should feel it.
    conn.execute("UPDATE tasks SET agent_config = '{}'::jsonb WHERE id = %s", (tid,))
    runner, rng = HostRunner(tmp_path), random.Random(35)

    def starts() -> int:
        return _count(conn, "SELECT count(*) FROM step_events WHERE task_id = %s AND step = 'plan'"
                            " AND event = 'start'", tid)

    def effect_state() -> str | None:
        row = conn.execute("SELECT state FROM effects WHERE task_id = %s", (tid,)).fetchone()
        return str(row[0]) if row else None

    def schedules() -> int:
        return Schedule.objects.filter(tenant=tenant).count()

    # Before anything reached the control plane, then with the schedule made and the answer lost, then after.
    plan = (["boot"] * 3 + ["unreachable"] * 2 + ["answer_held"] + ["lookup_held"] * 5 + ["lookup_unreachable"] * 2
            + ["lookup_held"] + ["back"] + ["committed"] * 5)
    assert len(plan) == KILLS
    seen: list[tuple[str, str | None, int]] = []
    try:
        for mode in plan:
            settings.SCHEDULES_PAUSE_S = 4 if mode in ("answer_held", "lookup_held") else 0
            run_env = dict(env)
            if mode in ("boot", "unreachable", "lookup_unreachable"):  # nothing listens there: nothing arrives
                run_env["AGENT_CONTROL_PLANE_URL"] = "http://127.0.0.1:9"
            before = starts()
            host = runner.start(run_env)
            if mode == "boot":  # anywhere from the boot to just after the step started
                time.sleep(rng.uniform(0.05, 0.8))
            elif mode == "answer_held":  # made (an earlier call never arrived: safe to make), the answer held
                _wait("the schedule made, its answer held", lambda: schedules() == 1, host)
            elif mode == "back":  # the control plane answers again: the lookup finds the schedule
                _wait("the effect committed", lambda: effect_state() == "committed", host)
            else:  # the replay's call or lookup is under way (held, or refused and waiting to try again)
                _wait("the step replayed", lambda: starts() > before, host)
                time.sleep(0.3 if mode != "committed" else rng.uniform(0.0, 0.3))
            host.kill()
            host.wait()
            seen.append((mode, effect_state(), schedules()))
        made_at = plan.index("answer_held")
        assert [n for _m, _e, n in seen] == [0] * made_at + [1] * (KILLS - made_at), seen
        assert [e for m, e, _n in seen if m != "boot"] == ["intent"] * (plan.index("back") - 3) + ["committed"] * 6
        settings.SCHEDULES_PAUSE_S = 0
        hold.unlink()
        host = runner.start(env)
        _wait("the task done", lambda: _count(conn, "SELECT count(*) FROM tasks WHERE id = %s AND status = 'done'",
                                              tid) == 1, host, timeout_s=30)
    finally:
        runner.stop_all()
        conn.close()
    made = Schedule.objects.get(tenant=tenant)  # exactly one, after twenty kills
    assert made.created_by_task == str(tid) and made.target == {"kind": "followup", "params": {"invoice": "inv-42"}}
    assert AuditLog.objects.filter(action=AuditAction.SCHEDULE_CREATE, tenant=tenant).count() == 1
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        effects = c.execute("SELECT effect, state, result->>'id', resolution FROM effects WHERE task_id = %s",
                            (tid,)).fetchall()
        done = c.execute("SELECT value FROM case_entries WHERE task_id = %s AND kind = 'done' AND key = 'plan'",
                         (tid,)).fetchone()
        replays = c.execute("SELECT count(*) FROM step_events WHERE task_id = %s AND event = 'start'",
                            (tid,)).fetchone()
    # Made once (after the calls that never arrived), settled by the lookup once the control plane could answer.
    assert effects == [("schedule", "committed", str(made.pk), "provider_lookup:found")]
    assert done is not None and done[0] == str(made.pk)
    assert replays is not None and replays[0] >= KILLS - 3  # the step itself ran (and was killed) that often
