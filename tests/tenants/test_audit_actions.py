"""Audit actions are one enum: no writer passes a string, and every public event still has an action behind it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import transaction

from provisioning.choices import DatabaseServerState, RecoveryOutcome, WorkflowKind
from releases.choices import ROLLOUT_ACTION_STATUSES, RolloutStatus
from tenants.actors import SYSTEM
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import AuditLog, Tenant
from tests import source_ast
from tests.conftest import BASE_DIR
from vault.choices import RotationKind
from webhooks.choices import RUNTIME_EVENT_TYPES, EventType
from webhooks.events import PUBLIC_ACTIONS, event_from_audit

PROJECT_PACKAGES = ("controlplane", "tenants", "vault", "provisioning", "dashboard", "portal", "branding",
                    "conversations", "webhooks", "releases", "schedules", "tests")


def _action_arguments() -> list[tuple[str, int, ast.expr]]:
    """The ``action=`` argument of every ``audit_record(...)`` call in the project, with where it is."""
    found = []
    for package in PROJECT_PACKAGES:
        for path in sorted((Path(BASE_DIR) / package).rglob("*.py")):
            tree = source_ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name != "audit_record":
                    continue
                for keyword in node.keywords:
                    if keyword.arg == "action":
                        found.append((str(path.relative_to(BASE_DIR)), node.lineno, keyword.value))
    return found


def _is_string_expression(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):  # "a." + b, "a.%s" % b
        return _is_string_expression(node.left) or _is_string_expression(node.right)
    if isinstance(node, ast.IfExp):  # Action.X if c else "x.y": one branch was a string (seen: release.unpin)
        return _is_string_expression(node.body) or _is_string_expression(node.orelse)
    if isinstance(node, ast.BoolOp):  # a or "x.y"
        return any(_is_string_expression(v) for v in node.values)
    return False


def test_no_audit_record_call_passes_a_string():
    calls = _action_arguments()
    assert len(calls) > 60, "the scan found the writers (it must not pass because it looked nowhere)"
    literal = [f"{path}:{line}" for path, line, value in calls if _is_string_expression(value)]
    assert literal == [], f"pass an AuditAction member, not a string: {literal}"


@pytest.mark.django_db
def test_the_writer_refuses_a_string_even_one_equal_to_a_member(operator):
    tenant = Tenant.objects.create(operator=operator, slug="strict", name="Strict")
    with pytest.raises(TypeError, match="AuditAction"), transaction.atomic():
        plain = str(AuditAction.TENANT_UPDATE.value)  # "tenant.update", as a plain str
        audit_record(actor=SYSTEM, action=plain, tenant=tenant)  # type: ignore[arg-type]
    assert not AuditLog.objects.filter(tenant=tenant).exists()
    row = audit_record(actor=SYSTEM, action=AuditAction.TENANT_UPDATE, tenant=tenant)
    row.refresh_from_db()
    assert row.action == "tenant.update" and type(row.action) is str  # stored as the same string as before


def test_every_value_is_unique_so_no_member_is_a_silent_alias():
    # Enum turns a second member with an existing value into an alias of the first, without a word.
    assert len(AuditAction.__members__) == len(list(AuditAction))


def test_public_events_name_existing_actions_and_every_event_type_has_one():
    assert PUBLIC_ACTIONS and all(isinstance(action, AuditAction) for action in PUBLIC_ACTIONS)
    produced = set()
    for action in AuditAction:
        datas = [{"to": s, "from": p} for s in TenantStatus for p in TenantStatus] \
            if action == AuditAction.TENANT_TRANSITION else [{}]
        for data in datas:
            # What webhooks.services hands over: the stored string, not the member.
            event = event_from_audit(action=str(action.value), data=data, target_id="1", tenant_slug="acme",
                                     tenant_status="ready")
            if event is not None:
                assert action in PUBLIC_ACTIONS
                produced.add(event.type)
    # The test button's event and those read from the instances' tables are the only types no audit action produces.
    assert produced == set(EventType) - {EventType.WEBHOOK_TEST} - RUNTIME_EVENT_TYPES


def test_the_stored_strings_of_public_actions_stay_what_receivers_and_old_rows_know():
    assert sorted(a.value for a in PUBLIC_ACTIONS) == sorted([
        "tenant.onboard", "tenant.update", "tenant.transition", "instance.start", "instance.stop", "instance.kill",
        "instance.restart", "instance.recovery.start", "instance.recovery.succeeded", "instance.recovery.failed",
        "instance.recovery.quarantined", "task.submit", "instance.submit_task", "task.cancel", "effect.decide",
        "connection.create", "connection.needs_reauth", "connection.disconnect",
    ])


def test_actions_derived_from_a_status_or_kind_cover_every_one():
    """Writers that pick the action by kind or status (a dict, not an f-string) have an entry for each."""
    from provisioning.databases.servers import _STATE_ACTIONS
    from provisioning.recovery.sweep import _OUTCOME_ACTIONS
    from provisioning.services import _RETRY_ACTIONS as WORKFLOW_RETRY
    from provisioning.services import _START_ACTIONS
    from releases.rollouts import _TRANSITION_ACTIONS
    from vault.rotation import _FINISH_ACTIONS
    from vault.rotation import _RETRY_ACTIONS as ROTATION_RETRY

    assert set(_START_ACTIONS) == set(WORKFLOW_RETRY) == set(WorkflowKind)
    assert set(_FINISH_ACTIONS) == set(ROTATION_RETRY) == set(RotationKind)
    assert set(_STATE_ACTIONS) == set(DatabaseServerState)
    assert set(_OUTCOME_ACTIONS) == {RecoveryOutcome.FAILED, RecoveryOutcome.QUARANTINED}
    # Every status a rollout action moves to (pause, resume, abort, rollback) has its action.
    assert {RolloutStatus.PAUSED, RolloutStatus.RUNNING, RolloutStatus.ABORTED, RolloutStatus.ROLLING_BACK} \
        == set(_TRANSITION_ACTIONS)
    assert set(ROLLOUT_ACTION_STATUSES) == {"pause", "resume", "abort", "rollback"}
