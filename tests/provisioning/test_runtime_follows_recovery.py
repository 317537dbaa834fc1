"""Issue 17 (staff screens): the runtime's record follows a recovery instead of saying "ready" throughout.

A real recovery on a real worker, paused after its start step (the moment the old code wrote "ready" while
nothing had resumed yet); the dashboard fragment staff watch shows the same status.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from branding.models import RolloutJob
from provisioning.choices import RecoveryOutcome
from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.fleet.instances import instance_kill
from provisioning.models import ProvisionedResource
from provisioning.recovery.sweep import drift_check
from provisioning.workflows.steps import runtime_resource_mark
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.branding.test_branding_rollout import _provisioned, _publish
from tests.conftest import onboard_ready, wait_for
from tests.provisioning.test_recovery import _host_pids, _sweep_until_dispatched, _wait_recovered

from . import test_recovery as recovery_world

# The recovery tests' world (agent-hosts heartbeating to a live server, a worker with fast recovery settings);
# the provider peers (``sinks``) come from conftest.
fleet = recovery_world.fleet


def _runtime(tenant: Tenant) -> ProvisionedResource:
    return ProvisionedResource.objects.get(tenant=tenant, kind="runtime")


def _runtime_row_html(client, tenant: Tenant) -> str:  # type: ignore[no-untyped-def]
    html = client.get(f"/dashboard/tenants/{tenant.pk}/live").content.decode()
    row = next(r for r in html.split("<tr>") if r.startswith("<td>runtime</td>"))
    return row


@pytest.mark.django_db(transaction=True)
def test_runtime_says_recovering_from_detection_until_resumed_then_ready(operator, fleet, worker_factory, client,
                                                                        django_user_model):
    tenant = onboard_ready(operator, "follow")
    assert _runtime(tenant).status == "ready"
    client.force_login(django_user_model.objects.create_user("oncall", password="pw-123456789", is_staff=True))
    # A worker that stops for a while right after the start step's effect: the instance runs, not yet verified.
    fleet["worker"].stop()
    worker_factory(**fleet["env"], PROVISIONING_PAUSE_AFTER_EFFECT_S="6", PROVISIONING_PAUSE_STEP="start")
    old_pids = _host_pids(tenant)
    instance_kill(tenant=tenant, actor=SYSTEM)
    _sweep_until_dispatched()
    assert _runtime(tenant).status == "recovering"  # committed with the recovery event
    assert drift_check() == []  # an instance under recovery is not dispatched twice

    def started() -> list[int]:
        pids = _host_pids(tenant)
        new = [p for p in pids if p not in old_pids]
        return new if new and _runtime(tenant).external_id == f"local-process:{new[0]}" else []

    wait_for(started, timeout=60, what="the start step recorded the new agent-host")
    runtime = _runtime(tenant)
    assert runtime.status == "recovering", runtime.status  # started is not resumed
    assert "s-recovering" in _runtime_row_html(client, tenant)
    event = _wait_recovered(tenant, timeout=120)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, (event.detail, fleet["worker"].log()[-2000:])
    assert _runtime(tenant).status == "ready"
    assert "s-ready" in _runtime_row_html(client, tenant)
    assert drift_check() == []


@pytest.mark.django_db(transaction=True)
def test_runtime_says_failed_when_the_recovery_fails(operator, fleet):
    tenant = onboard_ready(operator, "unlucky")
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(tenant.resource_name)))
    assert drift_check()
    assert _runtime(tenant).status == "recovering"
    event = _wait_recovered(tenant)
    assert event.outcome == RecoveryOutcome.FAILED
    assert _runtime(tenant).status == "failed"


@pytest.mark.django_db
def test_a_runtime_under_recovery_still_gets_the_operators_new_theme(operator):
    """Branding rollout targets ready runtimes; one being recovered must not be skipped (its start step may
    already have published the previous theme)."""
    tenants = [_provisioned(operator, f"brand-{i}") for i in range(3)]
    assert runtime_resource_mark(tenants[0], "recovering") == 1
    theme = _publish(operator)
    assert RolloutJob.objects.get(operator=operator, theme=theme).total == 3
