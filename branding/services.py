"""Branding writes: submit, validate and publish a theme, roll it out to every instance, resumably.

Flow: ``branding_submit`` (web) stores a pending revision and queues ``branding_revision_process``
(Celery), which validates and sanitizes, renders a content-hashed theme, makes it current and
starts a ``RolloutJob``. ``rollout_execute`` visits the operator's instances in id order and
commits each instance's new hash together with the job's cursor, so a killed worker resumes
where it was; an instance that already has the hash is left alone. Onboarding calls
``tenant_branding_publish`` from the runtime step, so a new customer is branded from the start.

Submissions and rollouts are two kinds of the job kernel (``controlplane.jobs``): ``branding-revision`` (a
pending submission) and ``branding-rollout``. The kernel holds the lease, marks a rollout running, records each
instance's progress with its heartbeat, resumes both from the one stall sweep after ``BRANDING_STALL_AFTER_S``
and sleeps the test-only pause ``BRANDING_ROLLOUT_PAUSE_PER_ITEM_S``; the rollout is driven by the kernel's one
wave rollout (``controlplane.jobs.waves``, fleet ``_BrandingWaves``). Supersession, counters and the finish audit
stay here.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from django.conf import settings
from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from controlplane.errors import Conflict, ProvisioningError, ValidationFailed
from controlplane.jobs import (
    JobKind,
    WaveEnd,
    WaveFleet,
    job_drive,
    job_kind_register,
    job_progress,
    job_start,
    waves_drive,
)
from provisioning.choices import ResourceKind, ResourceStatus
from provisioning.drivers.protocols import Capability, RuntimeDriver
from provisioning.drivers.registry import runtime_driver
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TenantStatus
from tenants.models import Operator, Tenant

from .choices import ACTIVE_ROLLOUT_STATUSES, RevisionStatus, RolloutStatus
from .models import BrandingAsset, BrandingDeployment, BrandingRevision, RolloutJob, Theme
from .render import theme_document, theme_hash
from .selectors import current_theme
from .validation import CleanBranding, CleanLogo, branding_validate, format_bytes, report_as_json

__all__ = [
    "PublishOutcome",
    "branding_submit",
    "branding_revision_process",
    "theme_ensure",
    "rollout_start",
    "rollout_retry",
    "rollout_execute",
    "REVISION_JOBS",
    "ROLLOUT_JOBS",
    "tenant_branding_publish",
]

log = logging.getLogger(__name__)

_NOT_BRANDED = (TenantStatus.DEPROVISIONING, TenantStatus.DELETED)


class PublishOutcome:
    PUBLISHED = "published"
    UNCHANGED = "unchanged"  # the instance already has this content hash
    SKIPPED = "skipped"  # the runtime driver cannot publish branding, or there is no valid theme
    FAILED = "failed"


# --- submit and validate -------------------------------------------------------------------------------


def branding_submit(
    *, operator: Operator, actor: Actor, product_name: str, primary_color: str, background_color: str,
    support_email: str = "", logo: bytes | None = None, remove_logo: bool = False,
) -> BrandingRevision:
    """Queue a branding change for validation. Only the size is checked here (nothing large is stored)."""
    limit = settings.BRANDING_LOGO_MAX_BYTES
    if logo is not None and len(logo) > limit:
        raise ValidationFailed(f"The logo is {format_bytes(len(logo))}; the limit is {format_bytes(limit)}.")
    keep = None
    if logo is None and not remove_logo:
        theme = current_theme(operator)
        keep = theme.logo if theme is not None else None
    with transaction.atomic():
        revision = BrandingRevision.objects.create(
            operator=operator, submitted_by=actor.label[:200], product_name=str(product_name)[:500],
            primary_color=str(primary_color)[:20], background_color=str(background_color)[:20],
            support_email=str(support_email or "")[:254], raw_logo=logo, keep_logo=keep,
        )
        audit_record(actor=actor, action=AuditAction.BRANDING_SUBMIT, target=revision, operator=operator,
                     data={"logo_bytes": len(logo) if logo is not None else None, "remove_logo": remove_logo})
        _enqueue_revision(revision)
    return revision


def _enqueue_revision(revision: BrandingRevision) -> None:
    job_start(REVISION_JOBS, revision.pk)


def branding_revision_process(revision_id: str) -> str:
    """Validate, sanitize and publish one submission. Idempotent: a processed revision is left as is."""
    with transaction.atomic():
        revision = BrandingRevision.objects.select_for_update(of=("self",)).select_related("operator", "keep_logo") \
            .filter(pk=revision_id).first()
        if revision is None or revision.status != RevisionStatus.PENDING:
            return revision.status if revision is not None else "missing"
        operator = revision.operator
        newer = BrandingRevision.objects.filter(operator=operator, created_at__gt=revision.created_at)
        if newer.exists():
            return _reject(revision, [{"field": "", "message": "Superseded by a newer submission."}], [])
        raw = bytes(revision.raw_logo) if revision.raw_logo is not None else None
        report = branding_validate(
            product_name=revision.product_name, primary_color=revision.primary_color,
            background_color=revision.background_color, support_email=revision.support_email, logo=raw,
        )
        messages = report_as_json(report)
        if not report.ok or report.clean is None:
            return _reject(revision, messages["errors"], messages["warnings"])
        clean = report.clean
        if raw is None and revision.keep_logo is not None:
            kept = revision.keep_logo
            clean = replace(clean, logo=CleanLogo(kept.content_type, bytes(kept.data), kept.sha256))
        theme = _theme_activate(operator, clean)
        Operator.objects.filter(pk=operator.pk).update(
            product_name=clean.product_name[:100], primary_color=clean.primary_color,
            background_color=clean.background_color, support_email=clean.support_email,
        )
        revision.status = RevisionStatus.PUBLISHED
        revision.theme = theme
        revision.warnings = messages["warnings"]
        revision.raw_logo = None
        revision.save(update_fields=["status", "theme", "warnings", "raw_logo", "updated_at"])
        audit_record(actor=SYSTEM, action=AuditAction.BRANDING_PUBLISH, target=theme, operator=operator,
                     data={"version": theme.version, "content_hash": theme.content_hash,
                           "revision": str(revision.pk)})
        rollout_start(operator=operator, theme=theme, actor=SYSTEM)
    return RevisionStatus.PUBLISHED


def _reject(revision: BrandingRevision, errors: list[dict[str, str]], warnings: list[dict[str, str]]) -> str:
    revision.status = RevisionStatus.REJECTED
    revision.errors = errors
    revision.warnings = warnings
    revision.raw_logo = None
    revision.save(update_fields=["status", "errors", "warnings", "raw_logo", "updated_at"])
    audit_record(actor=SYSTEM, action=AuditAction.BRANDING_REJECT, target=revision, operator=revision.operator,
                 data={"errors": [e["message"][:200] for e in errors]})
    return RevisionStatus.REJECTED


def _theme_activate(operator: Operator, clean: CleanBranding) -> Theme:
    """Make the theme for ``clean`` current: the existing one with the same hash, or a new version."""
    Operator.objects.select_for_update().filter(pk=operator.pk).first()  # serializes version numbers
    asset = None
    if clean.logo is not None:
        asset, _ = BrandingAsset.objects.get_or_create(
            sha256=clean.logo.sha256,
            defaults={"content_type": clean.logo.content_type, "data": clean.logo.data,
                      "size": len(clean.logo.data)},
        )
    document = theme_document(operator_slug=operator.slug, branding=clean)
    content_hash = theme_hash(document)
    now = timezone.now()
    theme = Theme.objects.filter(operator=operator, content_hash=content_hash).first()
    if theme is not None:
        theme.activated_at = now
        theme.save(update_fields=["activated_at"])
        return theme
    version = (Theme.objects.filter(operator=operator).aggregate(v=Max("version"))["v"] or 0) + 1
    return Theme.objects.create(operator=operator, version=version, content_hash=content_hash, document=document,
                                logo=asset, activated_at=now)


def theme_ensure(operator: Operator) -> Theme | None:
    """The operator's current theme; for an operator that never submitted one, render it from its
    own fields (no hand configuration needed). None if those fields are not valid branding."""
    theme = current_theme(operator)
    if theme is not None:
        return theme
    report = branding_validate(
        product_name=operator.product_name or operator.name, primary_color=operator.primary_color,
        background_color=operator.background_color, support_email=operator.support_email, logo=None,
    )
    if report.clean is None:
        log.warning("operator %s has no valid default branding: %s", operator.slug,
                    "; ".join(m.message for m in report.errors))
        return None
    with transaction.atomic():
        return current_theme(operator) or _theme_activate(operator, report.clean)


# --- publish to one instance ------------------------------------------------------------------------------


def tenant_branding_publish(*, tenant: Tenant, driver: RuntimeDriver | None = None) -> str:
    """Give ``tenant``'s instance its operator's current theme unless it already has that hash.

    The deployment row is locked while the theme is read and published, so onboarding and a
    rollout touching the same instance at once leave it with the newest theme.
    """
    driver = driver if driver is not None else runtime_driver()
    if Capability.PUBLISH_BRANDING not in driver.capabilities:
        return PublishOutcome.SKIPPED
    theme = theme_ensure(tenant.operator)
    if theme is None:
        return PublishOutcome.SKIPPED
    with transaction.atomic():
        deployment, _ = BrandingDeployment.objects.select_for_update().get_or_create(tenant=tenant)
        theme = current_theme(tenant.operator) or theme
        if deployment.content_hash == theme.content_hash:
            return PublishOutcome.UNCHANGED
        written = driver.publish_branding(tenant_spec(tenant), theme.document)
        if written != theme.content_hash:
            raise ProvisioningError(f"the runtime stored branding with hash {str(written)[:16]}, "
                                    f"expected {theme.content_hash[:16]}")
        deployment.theme = theme
        deployment.content_hash = theme.content_hash
        deployment.driver = driver.name
        deployment.published_at = timezone.now()
        deployment.publish_count += 1
        deployment.save()
    return PublishOutcome.PUBLISHED


# --- rollout ----------------------------------------------------------------------------------------------


def _targets(operator: Operator) -> QuerySet[Tenant]:
    """Instances that exist: tenants with a provisioned runtime. Others get branded when it is provisioned.

    A runtime being recovered counts: its start step may already have published the older theme.
    """
    return (Tenant.objects.filter(operator=operator, resources__kind=ResourceKind.RUNTIME,
                                  resources__status__in=(ResourceStatus.READY, ResourceStatus.RECOVERING))
            .exclude(status__in=_NOT_BRANDED).select_related("operator").order_by("id"))


def _enqueue_rollout(job: RolloutJob) -> None:
    job_start(ROLLOUT_JOBS, job.pk)


def rollout_start(*, operator: Operator, theme: Theme, actor: Actor) -> RolloutJob:
    """Start rolling ``theme`` out; an unfinished rollout of an older theme is superseded."""
    with transaction.atomic():
        Operator.objects.select_for_update().filter(pk=operator.pk).first()
        now = timezone.now()
        RolloutJob.objects.filter(operator=operator, status__in=ACTIVE_ROLLOUT_STATUSES).update(
            status=RolloutStatus.SUPERSEDED, finished_at=now, updated_at=now)
        job = RolloutJob.objects.create(operator=operator, theme=theme, total=_targets(operator).count())
        audit_record(actor=actor, action=AuditAction.BRANDING_ROLLOUT_START, target=job, operator=operator,
                     data={"version": theme.version, "content_hash": theme.content_hash, "total": job.total})
        _enqueue_rollout(job)
    return job


def rollout_retry(*, job: RolloutJob, actor: Actor) -> RolloutJob:
    """Run a finished rollout of the current theme again: instances already on it are skipped by hash."""
    with transaction.atomic():
        job = RolloutJob.objects.select_for_update().select_related("operator", "theme").get(pk=job.pk)
        if job.active:
            _enqueue_rollout(job)  # a stalled job: queue it again, the job lock prevents doubles
            return job
        current = current_theme(job.operator)
        if current is None or current.pk != job.theme_id:
            raise Conflict("a newer theme is current; its own rollout covers every instance")
        return rollout_start(operator=job.operator, theme=job.theme, actor=actor)


def _advance(job: RolloutJob, tenant: Tenant, outcome: str, error: str = "") -> None:
    counter = {PublishOutcome.PUBLISHED: "published", PublishOutcome.UNCHANGED: "unchanged",
               PublishOutcome.SKIPPED: "skipped", PublishOutcome.FAILED: "failed"}[outcome]
    job_progress(ROLLOUT_JOBS, job.pk, values={"cursor": tenant.pk}, add={"done": 1, counter: 1})
    if error:
        locked = RolloutJob.objects.select_for_update().get(pk=job.pk)
        errors = dict(locked.details.get("errors", {}))
        if len(errors) < 50:
            errors[str(tenant.pk)] = error[:300]
        locked.details = {**locked.details, "errors": errors}
        locked.save(update_fields=["details"])


def rollout_execute(job_id: str) -> str:
    """Execute or resume a rollout. Safe to call any number of times, from any worker."""
    return job_drive(ROLLOUT_JOBS, job_id)


class _BrandingWaves(WaveFleet[Tenant]):
    """The operator's live fleet as the wave driver's fleet: one wave walked in tenant id order behind the job's
    committed cursor (targets are not planned up front: an instance provisioned meanwhile is included, one that
    went is not), one instance at a time, inline (each publish commits with its progress in one transaction).
    No gate: a failed instance is counted and the rollout goes on; a newer theme stops it (superseded)."""

    threads = False

    def __init__(self, job: RolloutJob) -> None:
        self.job = job
        self.job_kind, self.job_id = ROLLOUT_JOBS, str(job.pk)
        self.cursor = job.cursor
        self.driver = runtime_driver()
        self.targets = _targets(job.operator)

    def _after_cursor(self) -> QuerySet[Tenant]:
        return self.targets if self.cursor is None else self.targets.filter(pk__gt=self.cursor)

    def proceeding(self) -> bool:
        return not RolloutJob.objects.filter(pk=self.job.pk, status=RolloutStatus.SUPERSEDED).exists()

    def next_wave(self) -> int | None:
        return 0 if self._after_cursor().exists() else None

    def remaining(self, wave: int, limit: int) -> list[Tenant]:
        return list(self._after_cursor()[:limit])

    def apply(self, target: Tenant) -> None:
        with transaction.atomic():
            outcome = tenant_branding_publish(tenant=target, driver=self.driver)
            _advance(self.job, target, outcome)
        self.cursor = target.pk

    def record_failure(self, target: Tenant, error: Exception) -> None:
        log.warning("branding rollout %s: instance of %s failed: %s", self.job.pk, target.pk, error)
        with transaction.atomic():
            _advance(self.job, target, PublishOutcome.FAILED, f"{error.__class__.__name__}: {error}")
        self.cursor = target.pk


def _rollout_run(job_id: str) -> str:
    """The rollout kind's body: the kernel holds the lease and has marked the job running."""
    job = RolloutJob.objects.select_related("operator", "theme").get(pk=job_id)
    log.info("branding rollout %s resuming at %s/%s", job.pk, job.done, job.total)
    if waves_drive(_BrandingWaves(job)).end == WaveEnd.STOPPED:
        return RolloutStatus.SUPERSEDED
    with transaction.atomic():
        job = RolloutJob.objects.select_for_update().get(pk=job.pk)
        if job.status == RolloutStatus.SUPERSEDED:
            return RolloutStatus.SUPERSEDED
        job.status = RolloutStatus.FAILED if job.failed else RolloutStatus.SUCCEEDED
        job.total = max(job.total, job.done)
        job.finished_at = timezone.now()
        job.error = f"{job.failed} instance(s) could not be updated" if job.failed else ""
        job.save(update_fields=["status", "total", "finished_at", "error", "updated_at"])
        audit_record(actor=SYSTEM, action=AuditAction.BRANDING_ROLLOUT_FINISH, target=job, operator=job.operator,
                     data={"status": job.status, "published": job.published, "unchanged": job.unchanged,
                           "skipped": job.skipped, "failed": job.failed})
    return job.status


# A pending submission is a job too: queued at submit, resumed by the sweep if its worker died. Processing
# serializes on the revision row itself, so it is not marked running (its status is pending until decided).
REVISION_JOBS = job_kind_register(JobKind(
    name="branding-revision", model=BrandingRevision, active_statuses=(RevisionStatus.PENDING,),
    run=branding_revision_process, running_status="", marks_started=False, stall_after_s="BRANDING_STALL_AFTER_S",
))
ROLLOUT_JOBS = job_kind_register(JobKind(
    name="branding-rollout", model=RolloutJob, active_statuses=tuple(ACTIVE_ROLLOUT_STATUSES), run=_rollout_run,
    running_status=RolloutStatus.RUNNING, stall_after_s="BRANDING_STALL_AFTER_S",
    pause_setting="BRANDING_ROLLOUT_PAUSE_PER_ITEM_S",
))
