"""The resource-kind table (provisioning/resources/kinds.py) against everything that reads it.

A kind added to ``ResourceKind`` without a row (or a row without a choice) fails here, before a tenant meets a
step, a repair or a portal page that does not know it. The workflow step names are checked against their
stored values: a run in flight resumes by name, so the table must produce exactly the names it always did.
"""

from __future__ import annotations

from django.test import override_settings

from portal.selectors import customer_usage
from portal.views import STEP_LABELS
from provisioning.choices import ResourceKind
from provisioning.drivers.registry import drivers_for_profile
from provisioning.models import ProvisionedResource
from provisioning.resources.kinds import DELETE_ORDER, RESOURCE_KINDS, repairable_kinds, resource_kind, runtime_secrets
from provisioning.workflows.steps import DEPROVISION_STEPS, ONBOARD_STEPS
from tenants.models import Tenant


def test_every_choice_has_one_row_and_every_row_a_choice() -> None:
    kinds = [row.kind for row in RESOURCE_KINDS]
    assert len(kinds) == len(set(kinds)), "a kind has two rows"
    missing, extra = set(ResourceKind) - set(kinds), set(kinds) - set(ResourceKind)
    assert not missing and not extra, f"choices without a row: {missing}; rows without a choice: {extra}"
    assert sorted(DELETE_ORDER) == sorted(kinds), "DELETE_ORDER must name every kind once"
    assert [resource_kind(k.value).kind for k in ResourceKind] == list(ResourceKind)


def test_rows_are_consistent() -> None:
    assert [row.kind for row in RESOURCE_KINDS if row.process] == [ResourceKind.RUNTIME], "exactly one process row"
    for row in RESOURCE_KINDS:
        # A driver kind that drift finds broken must be one recovery can mend (or the process it restarts).
        assert not row.has_driver or row.repair or row.process, row.kind
        assert not (row.repair and not row.has_driver), row.kind
        assert row.label and row.step_label and row.delete_step, row.kind
    assert [row.kind for row in repairable_kinds()][0] == ResourceKind.DATABASE


@override_settings(PROVISIONING_RUNTIME_DRIVER="")
def test_each_profile_has_a_driver_for_exactly_the_driver_kinds() -> None:
    wanted = {row.kind for row in RESOURCE_KINDS if row.has_driver}
    for profile in ("local", "kubernetes"):
        assert set(drivers_for_profile(profile)) == wanted, profile


def test_workflow_steps_keep_their_stored_names() -> None:
    assert [name for name, _ in ONBOARD_STEPS] == ["database", "volume", "objectstore", "vault", "runtime", "ready"]
    assert [name for name, _ in DEPROVISION_STEPS] == [
        "stop_runtime", "archive_database", "drop_database", "delete_objectstore", "delete_volume", "retire_vault",
        "deleted"]
    # Each step runs its own function (the plain ones are made per kind, never shared by two kinds).
    assert len({fn for _, fn in ONBOARD_STEPS}) == len(ONBOARD_STEPS)
    assert len({fn for _, fn in DEPROVISION_STEPS}) == len(DEPROVISION_STEPS)


def test_portal_labels_and_runtime_secrets_come_from_the_table() -> None:
    assert all(name in STEP_LABELS for name, _ in ONBOARD_STEPS)
    assert STEP_LABELS["objectstore"] == "Object storage"
    # What the instance's environment reads (drivers/local_process.instance_environment), in the old order.
    assert runtime_secrets() == ("db_password", "object_key_b64", "instance_token")


def test_the_portal_names_each_resource_by_its_row(operator) -> None:  # type: ignore[no-untyped-def]
    tenant = Tenant.objects.create(operator=operator, slug="kinds", name="Kinds")
    for row in RESOURCE_KINDS:
        ProvisionedResource.objects.create(tenant=tenant, kind=row.kind, driver="test", external_id=str(row.kind))
    assert customer_usage(tenant).resources == [
        ("database", "Database schema", "provisioning"), ("volume", "Working-files volume", "provisioning"),
        ("objectstore", "Object-storage prefix", "provisioning"), ("vault", "Encryption keys", "provisioning"),
        ("runtime", "Agent instance", "provisioning")]
