"""Theme rollout: idempotent by content hash, resumable after a SIGKILLed worker, and new customers
are branded at onboarding with no hand configuration."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest
from django.conf import settings

from branding.choices import RevisionStatus, RolloutStatus
from branding.models import BrandingDeployment, BrandingRevision, RolloutJob, Theme
from branding.services import (
    PublishOutcome,
    branding_revision_process,
    branding_submit,
    rollout_execute,
    rollout_retry,
    tenant_branding_publish,
)
from controlplane.jobs import jobs_resume_stalled
from provisioning.drivers.deferred_runtime import DeferredRuntimeDriver
from provisioning.drivers.protocols import Capability
from provisioning.models import ProvisionedResource
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tests.conftest import wait_for


def _provisioned(operator, slug: str) -> Tenant:
    """A tenant whose volume and runtime exist (recorded as the onboarding workflow would)."""
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug.title(), actor=SYSTEM)
    path = Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name
    path.mkdir(parents=True, exist_ok=True)
    ProvisionedResource.objects.create(tenant=tenant, kind="volume", driver="local-volume", external_id=str(path),
                                       details={"path": str(path)}, status="ready")
    ProvisionedResource.objects.create(tenant=tenant, kind="runtime", driver="local-process",
                                       external_id="local-process:0", status="ready")
    Tenant.objects.filter(pk=tenant.pk).update(status="ready")
    return tenant


def _branding_file(tenant: Tenant) -> Path:
    return Path(settings.LOCAL_VOLUME_ROOT) / tenant.resource_name / ".host" / "branding.json"


def _publish(operator, **overrides) -> Theme:
    values = {"product_name": "Alpha Agent", "primary_color": "#0b5394", "background_color": "#ffffff",
              "support_email": "help@alpha.example"}
    values.update(overrides)
    revision = branding_submit(operator=operator, actor=SYSTEM, **values)
    assert branding_revision_process(str(revision.pk)) == RevisionStatus.PUBLISHED
    revision.refresh_from_db()
    return revision.theme


@pytest.mark.django_db
def test_publish_writes_the_theme_file_atomically_and_is_idempotent_by_hash(operator):
    tenant = _provisioned(operator, "one")
    theme = _publish(operator)
    assert tenant_branding_publish(tenant=tenant) == PublishOutcome.PUBLISHED
    body = _branding_file(tenant).read_bytes()
    assert hashlib.sha256(body).hexdigest() == theme.content_hash
    assert json.loads(body)["product_name"] == "Alpha Agent"
    assert not list(_branding_file(tenant).parent.glob("*.tmp"))
    assert tenant_branding_publish(tenant=tenant) == PublishOutcome.UNCHANGED
    assert BrandingDeployment.objects.get(tenant=tenant).publish_count == 1


@pytest.mark.django_db
def test_rollout_reaches_every_instance_then_a_rerun_changes_nothing(operator):
    tenants = [_provisioned(operator, f"cust-{i}") for i in range(3)]
    pending, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="not-yet", name="Not Yet", actor=SYSTEM)
    theme = _publish(operator)
    job = RolloutJob.objects.get(operator=operator, theme=theme)
    assert job.total == 3  # the tenant still onboarding is branded by its own runtime step
    assert rollout_execute(str(job.pk)) == RolloutStatus.SUCCEEDED
    job.refresh_from_db()
    assert (job.done, job.published, job.unchanged, job.failed) == (3, 3, 0, 0)
    for tenant in tenants:
        assert hashlib.sha256(_branding_file(tenant).read_bytes()).hexdigest() == theme.content_hash
    assert not BrandingDeployment.objects.filter(tenant=pending).exists()

    again = rollout_retry(job=job, actor=SYSTEM)
    assert rollout_execute(str(again.pk)) == RolloutStatus.SUCCEEDED
    again.refresh_from_db()
    assert (again.done, again.published, again.unchanged) == (3, 0, 3)
    assert set(BrandingDeployment.objects.values_list("publish_count", flat=True)) == {1}


@pytest.mark.django_db
def test_same_branding_resubmitted_reuses_the_theme_version(operator):
    first = _publish(operator)
    second = _publish(operator, primary_color="#123456")
    back = _publish(operator)
    assert (first.version, second.version) == (1, 2)
    assert back.pk == first.pk
    from branding.selectors import current_theme

    assert current_theme(operator).pk == first.pk


@pytest.mark.django_db
def test_a_newer_theme_supersedes_an_unfinished_rollout(operator):
    _provisioned(operator, "one")
    _publish(operator)
    old = RolloutJob.objects.get(operator=operator)
    _publish(operator, primary_color="#123456")
    old.refresh_from_db()
    assert old.status == RolloutStatus.SUPERSEDED
    assert rollout_execute(str(old.pk)) == "finished"
    with pytest.raises(Exception, match="newer theme"):
        rollout_retry(job=old, actor=SYSTEM)


@pytest.mark.django_db
def test_a_failing_instance_is_recorded_and_the_rest_still_updated(operator):
    good = _provisioned(operator, "good")
    broken = _provisioned(operator, "broken")
    ProvisionedResource.objects.filter(tenant=broken, kind="volume").delete()  # nowhere to write
    theme = _publish(operator)
    job = RolloutJob.objects.get(operator=operator, theme=theme)
    assert rollout_execute(str(job.pk)) == RolloutStatus.FAILED
    job.refresh_from_db()
    assert (job.published, job.failed) == (1, 1)
    assert str(broken.pk) in job.details["errors"]
    assert _branding_file(good).exists()


@pytest.mark.django_db
def test_a_driver_without_publish_branding_is_skipped(operator):
    tenant = _provisioned(operator, "one")
    _publish(operator)

    class NoBranding(DeferredRuntimeDriver):  # has the method, but does not declare it: the declaration decides
        name = "no-branding"
        capabilities = frozenset[Capability]()

    assert tenant_branding_publish(tenant=tenant, driver=NoBranding()) == PublishOutcome.SKIPPED
    assert not BrandingDeployment.objects.filter(tenant=tenant).exists()
    assert tenant_branding_publish(tenant=tenant, driver=DeferredRuntimeDriver()) == PublishOutcome.PUBLISHED
    assert not _branding_file(tenant).exists()  # deferred: recorded only


@pytest.mark.django_db
def test_an_operator_that_never_submitted_branding_gets_a_default_theme(operator):
    tenant = _provisioned(operator, "one")
    assert not Theme.objects.filter(operator=operator).exists()
    assert tenant_branding_publish(tenant=tenant) == PublishOutcome.PUBLISHED
    theme = Theme.objects.get(operator=operator)
    assert theme.document["product_name"] == operator.product_name
    assert json.loads(_branding_file(tenant).read_text())["colors"]["primary"] == operator.primary_color


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_resumes_the_rollout_without_repeating_work(worker_factory, settings):
    operator = operator_create(slug="op-chaos", name="Chaos Op", actor=SYSTEM)
    tenants = [_provisioned(operator, f"cust-{i}") for i in range(4)]
    worker = worker_factory(BRANDING_ROLLOUT_PAUSE_PER_ITEM_S="1.5")
    revision = branding_submit(operator=operator, actor=SYSTEM, product_name="Chaos Agent",
                               primary_color="#0b5394", background_color="#ffffff")
    wait_for(lambda: RolloutJob.objects.filter(operator=operator, done__gte=1).exists(), timeout=60,
             what="the first instance of the rollout")
    worker.kill(signal.SIGKILL)
    job = RolloutJob.objects.get(operator=operator)
    assert job.status == RolloutStatus.RUNNING and 1 <= job.done < 4, (job.status, job.done)
    done_before_kill = job.done

    settings.BRANDING_STALL_AFTER_S = 0
    assert jobs_resume_stalled() >= 1  # the kernel's one sweep, BRANDING_STALL_AFTER_S as this kind's stall
    worker_factory()
    wait_for(lambda: RolloutJob.objects.get(pk=job.pk).status == RolloutStatus.SUCCEEDED, timeout=90,
             what="the resumed rollout")
    job.refresh_from_db()
    theme = BrandingRevision.objects.get(pk=revision.pk).theme
    assert job.done == 4 and job.failed == 0 and job.done >= done_before_kill
    for tenant in tenants:
        assert hashlib.sha256(_branding_file(tenant).read_bytes()).hexdigest() == theme.content_hash
    # Each instance was published exactly once: the resumed worker started after the committed cursor.
    assert list(BrandingDeployment.objects.filter(tenant__in=tenants).values_list("publish_count", flat=True)) \
        == [1, 1, 1, 1]


@pytest.mark.django_db(transaction=True)
def test_new_customers_are_branded_at_onboarding(worker_factory):
    operator = operator_create(slug="op-onboard", name="Onboard Op", actor=SYSTEM)
    worker_factory(PROVISIONING_RUNTIME_DRIVER="deferred")
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="fresh", name="Fresh", actor=SYSTEM)
    wait_for(lambda: Tenant.objects.get(pk=tenant.pk).status == "ready", timeout=90, what="onboarding")
    deployment = BrandingDeployment.objects.get(tenant=tenant)
    theme = Theme.objects.get(operator=operator)
    assert deployment.content_hash == theme.content_hash and deployment.driver == "deferred"
    assert theme.document["product_name"] == "Onboard Op"
