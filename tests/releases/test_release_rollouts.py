"""Issue 14: rolling a release out across an operator's tenants, with a canary, a health gate and rollback.

The planning and the API's refusals run on database rows. The rollouts themselves run end to end: real
wheels uploaded through the real validation, real ``agent-host`` processes (sandboxed where this machine
can), the workflow on a real Celery worker (SIGKILLed in one test), tasks with real irreversible effects
against the payment and SMTP peers, and the instances' own boot records as the proof of what each runs.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.jobs import jobs_resume_stalled
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from releases.assignments import booted_release, release_default_set, tenant_release_initial
from releases.models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout, RolloutItem
from releases.services import release_create
from tenants.actors import SYSTEM
from tenants.models import Operator, Tenant
from tenants.services import operator_create
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.provisioning.test_recovery import _events, _payments
from tests.releases.test_releases_upload import make_wheel
from tests.vault.test_vault_helpers import assert_problem

GREETER = '''
from agent_runtime.sdk import Agent

agent = Agent("greeter", description="greeter {version}")


@agent.step
def greet(ctx):
    return {{"greeted": ctx.params.get("name", "you"), "version": {version!r}}}
'''
# Passes validation (the probe is no instance), then dies at import in every instance: a crash on boot.
CRASHER = '''
import os

if os.environ.get("AGENT_TENANT_ID"):
    os._exit(3)

from agent_runtime.sdk import Agent

agent = Agent("greeter", description="crashes on boot")


@agent.step
def greet(ctx):
    return {{}}
'''
ENTRY_POINTS = "[agent_runtime.agents]\ngreeter = greeter_agent:agent\n"


def _release(operator: Operator, version: str, module: str = GREETER) -> AgentRelease:
    filename, data = make_wheel("greeter-agent", version, module=module.format(version=version),
                                entry_points=ENTRY_POINTS)
    return release_create(operator=operator, filename=filename, data=data, actor=SYSTEM)


def _fake_release(operator: Operator, version: str) -> AgentRelease:
    return AgentRelease.objects.create(operator=operator, version=version, distribution="x",
                                       digest="sha256:" + "1" * 64, filename="x.whl", size_bytes=1,
                                       artifact_key="x", kinds={"x": ""})


# --- planning and the API (database rows; nothing is restarted) ---------------------------------------------


@pytest.fixture
def ready_tenants(operator):  # type: ignore[no-untyped-def]
    from provisioning.workflows.onboarding import tenant_onboard

    made = []
    for i in range(8):
        tenant, _ = tenant_onboard(operator=operator, slug=f"plan-{i}", name=f"Plan {i}",
                                   actor=SYSTEM, allow_no_release=True)
        made.append(tenant)
    Tenant.objects.filter(pk__in=[t.pk for t in made]).update(status="ready")
    return made


@pytest.mark.django_db
def test_a_rollout_is_planned_as_a_canary_then_waves_leaving_pinned_and_current_tenants_out(api, operator,
                                                                                               ready_tenants):
    old, new = _fake_release(operator, "1.0.0"), _fake_release(operator, "2.0.0")
    pinned, current = ready_tenants[2], ready_tenants[5]
    ReleaseAssignment.objects.create(tenant=pinned, release=old, pinned=True)
    ReleaseAssignment.objects.create(tenant=current, release=new)
    response = api.post("/api/v1/rollouts", {"release": str(new.pk), "canary": 2, "wave_size": 2, "soak_s": 5},
                        format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "running" and body["canary"] == 2 and body["counts"]["pending"] == 6
    by_tenant = {i["tenant"]: i for i in body["items"]}
    assert str(pinned.pk) not in by_tenant and str(current.pk) not in by_tenant
    planned = [t for t in ready_tenants if t not in (pinned, current)]  # oldest first
    assert [by_tenant[str(t.pk)]["wave"] for t in planned] == [0, 0, 1, 1, 2, 2]
    assert all(i["from_release"] is None for i in body["items"])
    # One active rollout per operator.
    again = api.post("/api/v1/rollouts", {"release": str(new.pk)}, format="json")
    assert assert_problem(again, 409)["type"].endswith("invalid-transition")
    assert api.get(f"/api/v1/rollouts/{body['id']}").json()["items"] == body["items"]
    assert [r["id"] for r in api.get("/api/v1/rollouts").json()] == [body["id"]]


@pytest.mark.django_db
def test_a_canary_percentage_is_at_least_one_tenant(api, operator, ready_tenants):
    new = _fake_release(operator, "2.0.0")
    response = api.post("/api/v1/rollouts", {"release": str(new.pk), "canary_percent": 10, "wave_size": 3},
                        format="json")
    assert response.status_code == 202, response.content
    assert response.json()["canary"] == 1
    waves = [i["wave"] for i in response.json()["items"]]
    assert waves == [0, 1, 1, 1, 2, 2, 2, 3]


@pytest.mark.django_db
def test_an_instance_that_ran_before_releases_existed_is_on_the_runtime_agents_not_the_new_default(api, operator,
                                                                                                  ready_tenants):
    from provisioning.models import ProvisionedResource

    new = _fake_release(operator, "2.0.0")
    release_default_set(operator=operator, release_id=new.pk, actor=SYSTEM)
    ran_before = ready_tenants[0]  # started once already, with no assignment recorded
    ProvisionedResource.objects.create(tenant=ran_before, kind="runtime", driver="local-process", external_id="x")
    assert api.get(f"/api/v1/tenants/{ran_before.pk}/release").json()["release"] is None
    assert not ReleaseAssignment.objects.filter(tenant=ran_before).exists()  # a read records nothing
    body = api.post("/api/v1/rollouts", {"release": str(new.pk)}, format="json").json()
    planned = {i["tenant"] for i in body["items"]}
    # It is moved by the rollout (from the runtime agents); the never-started ones start on the default.
    assert str(ran_before.pk) in planned and len(planned) == 1, planned
    assert ReleaseAssignment.objects.get(tenant=ran_before).release is None
    assert ReleaseAssignment.objects.get(tenant=ready_tenants[1]).release == new


@pytest.mark.django_db
def test_rolling_back_a_succeeded_rollout_restores_the_previous_default(operator):
    from releases.rollouts import rollout_create, rollout_execute, rollout_rollback

    old, new = _fake_release(operator, "1.0.0"), _fake_release(operator, "2.0.0")
    release_default_set(operator=operator, release_id=old.pk, actor=SYSTEM)
    rollout = rollout_create(operator=operator, release_id=new.pk, actor=SYSTEM)  # no tenant to move
    assert rollout.previous_default == old
    assert rollout_execute(str(rollout.pk)) == "succeeded"
    assert DefaultRelease.objects.get(operator=operator).release == new
    rollout_rollback(rollout=Rollout.objects.get(pk=rollout.pk), actor=SYSTEM)
    assert rollout_execute(str(rollout.pk)) == "rolled_back"
    assert DefaultRelease.objects.get(operator=operator).release == old
    # With no default before it, a rollback leaves none.
    third = rollout_create(operator=operator, release_id=_fake_release(operator, "3.0.0").pk, actor=SYSTEM)
    DefaultRelease.objects.filter(operator=operator).delete()
    Rollout.objects.filter(pk=third.pk).update(previous_default=None)
    assert rollout_execute(str(third.pk)) == "succeeded"
    rollout_rollback(rollout=Rollout.objects.get(pk=third.pk), actor=SYSTEM)
    assert rollout_execute(str(third.pk)) == "rolled_back"
    assert not DefaultRelease.objects.filter(operator=operator).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "field"), [
    ({"wave_size": 0}, "wave_size"), ({"soak_s": -1}, "soak_s"), ({"canary": 0}, "canary"),
    ({"canary_percent": 0}, "canary_percent"), ({"canary_percent": 101}, "canary_percent"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_rollout_parameters_are_400_and_plan_nothing(api, operator, ready_tenants, body, field):
    new = _fake_release(operator, "2.0.0")
    response = api.post("/api/v1/rollouts", {"release": str(new.pk), **body}, format="json")
    assert_problem(response, 400)
    assert field in response.content.decode()
    assert not Rollout.objects.exists()


@pytest.mark.django_db
def test_canary_and_canary_percent_together_are_refused(api, operator, ready_tenants):
    new = _fake_release(operator, "2.0.0")
    response = api.post("/api/v1/rollouts", {"release": str(new.pk), "canary": 1, "canary_percent": 5},
                        format="json")
    assert_problem(response, 400)
    assert not Rollout.objects.exists()


@pytest.mark.django_db
def test_another_operators_release_cannot_be_rolled_out_pinned_or_made_default(api, operator, ready_tenants):
    other = operator_create(slug="other-op", name="Other", actor=SYSTEM)
    theirs = _fake_release(other, "9.9.9")
    assert_problem(api.post("/api/v1/rollouts", {"release": str(theirs.pk)}, format="json"), 404)
    assert_problem(api.put("/api/v1/releases/default", {"release": str(theirs.pk)}, format="json"), 404)
    assert_problem(api.put(f"/api/v1/tenants/{ready_tenants[0].pk}/release",
                           {"release": str(theirs.pk), "pinned": True}, format="json"), 404)
    assert_problem(api.get(f"/api/v1/releases/{theirs.pk}"), 404)
    assert not Rollout.objects.exists() and not DefaultRelease.objects.exists()
    assert not ReleaseAssignment.objects.filter(release=theirs).exists()


@pytest.mark.django_db
def test_pause_resume_abort_and_rollback_follow_the_rollout_state(api, operator, ready_tenants):
    new = _fake_release(operator, "2.0.0")
    rollout_id = api.post("/api/v1/rollouts", {"release": str(new.pk)}, format="json").json()["id"]
    base = f"/api/v1/rollouts/{rollout_id}"
    assert assert_problem(api.post(f"{base}/resume"), 409)["type"].endswith("invalid-transition")
    assert api.post(f"{base}/pause").json()["status"] == "paused"
    assert assert_problem(api.post(f"{base}/pause"), 409)["type"].endswith("invalid-transition")
    assert api.post(f"{base}/resume").json()["status"] == "running"
    aborted = api.post(f"{base}/abort").json()
    assert aborted["status"] == "aborted" and aborted["finished_at"] and "aborted by" in aborted["reason"]
    assert assert_problem(api.post(f"{base}/abort"), 409)["type"].endswith("invalid-transition")
    # A later rollout makes this one's rollback meaningless: refused.
    later = api.post("/api/v1/rollouts", {"release": str(_fake_release(operator, "3.0.0").pk)}, format="json")
    assert later.status_code == 202
    assert assert_problem(api.post(f"{base}/rollback"), 409)["type"].endswith("invalid-transition")
    assert_problem(api.post("/api/v1/rollouts/not-a-uuid/pause"), 404)


@pytest.mark.django_db
def test_the_default_release_is_what_new_customers_start_on_and_pinning_needs_a_release(api, operator,
                                                                                          ready_tenants):
    new = _fake_release(operator, "2.0.0")
    assert api.get("/api/v1/releases/default").json() == {"release": None}
    answer = api.put("/api/v1/releases/default", {"release": str(new.pk)}, format="json")
    assert answer.status_code == 200 and answer.json()["release"]["version"] == "2.0.0"
    # Existing tenants without an assignment yet start on it at their next start; nobody is restarted now.
    assert tenant_release_initial(tenant=ready_tenants[0]).release == new
    seen = api.get(f"/api/v1/tenants/{ready_tenants[1].pk}/release").json()
    assert seen["release"]["version"] == "2.0.0" and seen["pinned"] is False and seen["running"] is None
    assert_problem(api.put(f"/api/v1/tenants/{ready_tenants[1].pk}/release", {"pinned": True}, format="json"), 400)
    release_default_set(operator=operator, release_id=new.pk, actor=SYSTEM)
    assert DefaultRelease.objects.get(operator=operator).release == new


# --- end to end: real instances, a real worker ----------------------------------------------------------------


@pytest.fixture
def rollout_fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    """Releases under the control plane's var/ (hidden from instances but their own release), and a worker
    running onboarding and the rollouts with short timeouts and a fast gate."""
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.5,AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=8")
    env = {"CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": extra,
           "RELEASES_ROOT": str(root), "RELEASE_GATE_POLL_S": "0.3", "RUNTIME_READY_TIMEOUT_S": "20",
           "RUNTIME_STOP_GRACE_S": "15", "RECOVERY_VERIFY_TIMEOUT_S": "30", "WORKFLOW_STALL_AFTER_S": "5"}
    yield {"env": env, "start": lambda **more: worker_factory(**{**env, **more}), "sinks": sinks}
    kill_session_instances()
    shutil.rmtree(root, ignore_errors=True)


def _finished(rollout: Rollout, timeout: float = 240) -> Rollout:
    wait_for(lambda: Rollout.objects.get(pk=rollout.pk).status not in ("running", "rolling_back", "paused"),
             timeout=timeout, what="the rollout finished")
    return Rollout.objects.get(pk=rollout.pk)


def _items(rollout: Rollout) -> list[RolloutItem]:
    return list(RolloutItem.objects.filter(rollout=rollout).select_related("tenant").order_by("wave", "id"))


def _boots_on(tenant: Tenant, digest: str | None) -> int:
    rows = _events(tenant, "SELECT detail -> 'release' ->> 'digest' FROM {s}.host_events WHERE kind = 'boot'")
    return sum(1 for (d,) in rows if d == digest)


@pytest.mark.django_db(transaction=True)
def test_a_good_release_rolls_out_in_waves_and_becomes_the_default(operator, rollout_fleet):
    from releases.rollouts import rollout_create

    rollout_fleet["start"]()
    tenants = [onboard_ready(operator, f"good-{i}") for i in range(3)]
    release = _release(operator, "2.0.0")
    rollout = rollout_create(operator=operator, release_id=release.pk, actor=SYSTEM, canary=1, wave_size=2,
                             soak_s=1)
    rollout = _finished(rollout)
    items = _items(rollout)
    assert rollout.status == "succeeded", (rollout.reason, [(i.status, i.error) for i in items])
    assert [(i.wave, i.status, i.upgrades) for i in items] == [(0, "upgraded", 1), (1, "upgraded", 1),
                                                               (1, "upgraded", 1)]
    # The canary soaked before wave 1 began.
    assert items[0].upgraded_at is not None and items[1].started_at is not None
    assert (items[1].started_at - items[0].upgraded_at).total_seconds() >= 1
    assert DefaultRelease.objects.get(operator=operator).release == release
    for tenant in tenants:
        assert _boots_on(tenant, release.digest) == 1
        assert booted_release(tenant, since=None)[1]["version"] == "2.0.0"
        assert ReleaseAssignment.objects.get(tenant=tenant).release == release
    # The new release really serves: a task of its kind runs to the end.
    instance_submit_task(tenant=tenants[1], kind="greeter", params={"name": "rollout"}, actor=SYSTEM)
    wait_for(lambda: instance_task_summary(tenant=tenants[1])["tasks"].get("done") == 1, timeout=60,
             what="the greeter task done")


@pytest.mark.django_db(transaction=True)
def test_a_release_that_crashes_on_boot_is_rolled_back_from_the_canary_and_no_one_else_is_touched(
        operator, rollout_fleet):
    from releases.rollouts import rollout_create

    rollout_fleet["start"]()
    tenants = [onboard_ready(operator, f"fleet-{i:02d}") for i in range(10)]
    broken = _release(operator, "2.0.0", CRASHER)
    before = _payments(rollout_fleet["sinks"])
    # A task mid-way on the canary (the oldest tenant) and on an untouched one while the rollout starts.
    tasks = {t.pk: instance_submit_task(tenant=t, kind="demo", params={"search_s": 0.3, "step_sleep_s": 1.5},
                                        actor=SYSTEM) for t in (tenants[0], tenants[5])}
    wait_for(lambda: len(_events(tenants[0], "SELECT 1 FROM {s}.step_events WHERE event = 'done'")) >= 1,
             timeout=60, what="the canary's task under way")
    assert instance_task_summary(tenant=tenants[0])["tasks"].get("done") is None  # still under way
    rollout = rollout_create(operator=operator, release_id=broken.pk, actor=SYSTEM, canary=1, wave_size=5,
                             soak_s=2)
    rollout = _finished(rollout)
    items = _items(rollout)
    canary, rest = items[0], items[1:]
    assert rollout.status == "rolled_back", rollout.reason
    assert "wave 0 failed" in rollout.reason and "exited during start" in canary.error, (rollout.reason, canary.error)
    assert canary.tenant == tenants[0] and canary.status == "rolled_back" and canary.upgrades == 1
    assert len(rest) == 9 and all(i.status == "pending" and i.upgrades == 0 and i.started_at is None for i in rest)
    # The canary runs its previous release (the runtime's agents) again; nobody else was ever restarted.
    assert booted_release(tenants[0], since=None)[1] is None
    assert ReleaseAssignment.objects.get(tenant=tenants[0]).release is None
    for tenant in tenants[1:]:
        assert _events(tenant, "SELECT count(*) FROM {s}.host_events WHERE kind = 'boot'") == [(1,)]
        assert ReleaseAssignment.objects.get(tenant=tenant).release is None
    assert not DefaultRelease.objects.filter(operator=operator).exists()
    # No task lost: both finish; no effect performed twice: every step done once, one charge per task.
    for tenant in (tenants[0], tenants[5]):
        wait_for(lambda t=tenant: instance_task_summary(tenant=t)["tasks"].get("done") == 1, timeout=90,
                 what=f"the task of {tenant.slug} done")
        done_steps = _events(tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
        assert done_steps and all(n == 1 for _, n in done_steps), done_steps
        assert sorted(_events(tenant, "SELECT effect, state FROM {s}.effects")) == [
            ("email", "committed"), ("payment", "committed")]
    charges = {k: v for k, v in _payments(rollout_fleet["sinks"]).items() if k not in before}
    print(f"crash-on-boot rollout: tenants={len(items)} canary_rolled_back=1 untouched={len(rest)} "
          f"tasks_done={len(tasks)} charges={sorted(charges.values())}")
    assert sorted(charges.values()) == [1, 1], charges


@pytest.mark.django_db(transaction=True)
def test_a_release_without_a_kind_customers_use_blocks_its_tasks_fails_the_gate_and_the_rollback_finishes_them(
        operator, rollout_fleet):
    from releases.rollouts import rollout_create

    rollout_fleet["start"]()
    tenants = [onboard_ready(operator, f"kind-{i}") for i in range(2)]
    greeter_only = _release(operator, "2.0.0")  # provides 'greeter', not the customers' 'demo'
    before = _payments(rollout_fleet["sinks"])
    rollout = rollout_create(operator=operator, release_id=greeter_only.pk, actor=SYSTEM, canary=1, wave_size=1,
                             soak_s=20)
    # The canary is upgraded; during its soak a customer asks for a 'demo' task, which the release cannot run.
    wait_for(lambda: RolloutItem.objects.filter(rollout=rollout, wave=0, status="upgraded").exists(), timeout=120,
             what="the canary upgraded")
    instance_submit_task(tenant=tenants[0], kind="demo", params={"search_s": 0.3, "step_sleep_s": 0.2},
                         actor=SYSTEM)
    rollout = _finished(rollout)
    canary, second = _items(rollout)
    assert rollout.status == "rolled_back", rollout.reason
    assert "task(s) blocked (unknown_kind)" in canary.error, canary.error
    assert canary.status == "rolled_back" and second.status == "pending" and second.upgrades == 0
    # The host did not crash on it: one boot on the release, then the rollback's boot on the runtime agents.
    assert _boots_on(tenants[0], greeter_only.digest) == 1 and booted_release(tenants[0], since=None)[1] is None
    assert _events(tenants[0], "SELECT count(*) FROM {s}.host_events WHERE kind = 'crash'") == [(0,)]
    wait_for(lambda: instance_task_summary(tenant=tenants[0])["tasks"].get("done") == 1, timeout=90,
             what="the task finished after the rollback")
    unblocked = _events(tenants[0], "SELECT (detail ->> 'unblocked_tasks')::int FROM {s}.host_events"
                                    " WHERE kind = 'boot' ORDER BY id DESC LIMIT 1")
    assert unblocked == [(1,)]
    done_steps = _events(tenants[0], "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
    assert done_steps and all(n == 1 for _, n in done_steps), done_steps
    charges = {k: v for k, v in _payments(rollout_fleet["sinks"]).items() if k not in before}
    assert list(charges.values()) == [1], charges


# Three steps, the middle one as long as the task asks: a rollout stops the instance at its end (a step boundary).
STEPPER = '''
import time
from agent_runtime.sdk import Agent

agent = Agent("greeter", version_policy={policy!r})


@agent.step
def first(ctx):
    return {{"version": {version!r}}}


@agent.step
def slow(ctx):
    end = time.monotonic() + float(ctx.params.get("slow_s", 0))
    while time.monotonic() < end:
        ctx.progress()
        time.sleep(0.05)
    return {{"version": {version!r}}}


@agent.step
def last(ctx):
    return {{"version": {version!r}}}
'''


def _stepper(operator: Operator, version: str, policy: str = "pinned") -> AgentRelease:
    return _release(operator, version, STEPPER.replace("{policy!r}", repr(policy)))


def _versions_of(tenant: Tenant, task_id: object) -> dict[str, str]:
    rows = _events(tenant, "SELECT key, value ->> 'version' FROM {s}.case_entries"
                           f" WHERE kind = 'done' AND task_id = '{task_id}'")
    return dict(rows)


def _task_mid_rollout(operator: Operator, tenant: Tenant, release: AgentRelease) -> tuple[Rollout, object]:
    """A task under way in its slow step when a rollout to ``release`` begins; the rollout, finished."""
    from releases.rollouts import rollout_create

    task_id = instance_submit_task(tenant=tenant, kind="greeter", params={"slow_s": 3}, actor=SYSTEM)
    wait_for(lambda: _events(tenant, "SELECT 1 FROM {s}.step_events WHERE step = 'slow' AND event = 'start'"
                                     f" AND task_id = '{task_id}'"), timeout=60, what="the slow step under way")
    return _finished(rollout_create(operator=operator, release_id=release.pk, actor=SYSTEM, canary=1, soak_s=2)), \
        task_id


@pytest.mark.django_db(transaction=True)
def test_a_task_started_on_one_release_finishes_on_it_during_a_rollout_and_the_gate_counts_crossings(
        operator, rollout_fleet):
    from releases.rollouts import rollout_create

    rollout_fleet["start"]()
    tenant = onboard_ready(operator, "pinned-0")
    v1, v2, v3 = _stepper(operator, "1.0.0"), _stepper(operator, "2.0.0"), _stepper(operator, "3.0.0", "compatible")
    assert _finished(rollout_create(operator=operator, release_id=v1.pk, actor=SYSTEM, canary=1,
                                    soak_s=1)).status == "succeeded"

    # 1.0.0 -> 2.0.0 with a task between its steps: it finishes on 1.0.0, the release it started on.
    rollout, task_id = _task_mid_rollout(operator, tenant, v2)
    (item,) = _items(rollout)
    assert rollout.status == "succeeded", (rollout.reason, item.error)
    wait_for(lambda: len(_versions_of(tenant, task_id)) == 3, timeout=60, what="the task finished")
    assert _versions_of(tenant, task_id) == {"first": "1.0.0", "slow": "1.0.0", "last": "1.0.0"}
    assert item.tasks_crossed == 0
    assert booted_release(tenant, since=None)[1]["version"] == "2.0.0"
    assert ReleaseAssignment.objects.get(tenant=tenant).retained == [str(v1.pk), ""]

    # 2.0.0 -> 3.0.0, whose agent declares its steps compatible: the task continues on 3.0.0, counted by the gate.
    rollout, task_id = _task_mid_rollout(operator, tenant, v3)
    (item,) = _items(rollout)
    assert rollout.status == "succeeded", (rollout.reason, item.error)
    wait_for(lambda: len(_versions_of(tenant, task_id)) == 3, timeout=60, what="the task finished")
    assert _versions_of(tenant, task_id) == {"first": "2.0.0", "slow": "2.0.0", "last": "3.0.0"}
    assert item.tasks_crossed == 1
    done_steps = _events(tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done'"
                                 f" AND task_id = '{task_id}' GROUP BY step")
    assert sorted(done_steps) == [("first", 1), ("last", 1), ("slow", 1)]


@pytest.mark.django_db(transaction=True)
def test_a_sigkilled_rollout_worker_resumes_without_upgrading_anyone_twice_or_skipping_anyone(
        operator, rollout_fleet, settings):
    from releases.rollouts import rollout_create

    onboarding = rollout_fleet["start"]()
    tenants = [onboard_ready(operator, f"kill-{i}") for i in range(4)]
    onboarding.stop()
    release = _release(operator, "2.0.0")
    worker = rollout_fleet["start"](RELEASE_ROLLOUT_CONCURRENCY="1")
    rollout = rollout_create(operator=operator, release_id=release.pk, actor=SYSTEM, canary=1, wave_size=3,
                             soak_s=1)

    def mid_wave() -> bool:
        statuses = list(RolloutItem.objects.filter(rollout=rollout, wave=1).values_list("status", flat=True))
        return "upgrading" in statuses and "pending" in statuses

    wait_for(mid_wave, timeout=180, interval=0.05, what="wave 1 under way")
    time.sleep(0.5)  # somewhere inside the switch: the stop, the start or the boot check
    worker.kill(signal.SIGKILL)
    killed_at: dict[str, Any] = {i.tenant.slug: i.status for i in _items(rollout)}
    assert Rollout.objects.get(pk=rollout.pk).status == "running", killed_at
    settings.RELEASE_ROLLOUT_STALL_AFTER_S = 0
    rollout_fleet["start"](RELEASE_ROLLOUT_CONCURRENCY="1")
    assert jobs_resume_stalled() == 1  # the kernel's one sweep, RELEASE_ROLLOUT_STALL_AFTER_S as this kind's stall
    rollout = _finished(rollout)
    items = _items(rollout)
    assert rollout.status == "succeeded", (rollout.reason, killed_at, [(i.status, i.error) for i in items])
    assert all(i.status == "upgraded" for i in items) and len(items) == 4
    for tenant in tenants:
        # Exactly one boot on the new release per tenant: none upgraded twice, none skipped.
        assert _boots_on(tenant, release.digest) == 1, (tenant.slug, killed_at)
    print(f"killed mid-wave with items {killed_at}; after resume: "
          f"{[(i.tenant.slug, i.status, i.upgrades) for i in items]}")
