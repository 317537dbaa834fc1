"""Rolling a release out across an operator's tenants: canary, health gate, waves, automatic rollback.

A resumable workflow like the branding rollout and the rolling restart, and like them a kind of the job kernel
(``controlplane.jobs``, kind ``release-rollout``): every decision is committed on the rollout or its items
before it is acted on, one executor at a time holds the rollout's lease, and the kernel's one sweep queues
again a working rollout that stopped moving for ``RELEASE_ROLLOUT_STALL_AFTER_S`` (a SIGKILLed worker). The
status machine (running, paused, rolling back) stays here: the kernel does not mark it. The waves are planned
(``WavePlan``, ``canary_size``) and driven (``waves_drive``: a wave's upgrades, its soak under the health gate,
the stop on a failure) by the kernel's one wave rollout (``controlplane.jobs.waves``); this module says what a
wave's target is (``_UpgradeWaves``, and ``_RollbackWaves`` for the rollback), what the gate checks and what a
failure means (rolling back). What makes a resume safe:

- an item left ``upgrading`` by a killed worker is first checked against the instance's own boot records:
  if it already booted the new release since the item started, it is marked upgraded without another
  restart (never upgraded twice); otherwise the switch is redone (stop and start are idempotent);
- the soak of a wave is a deadline stored in the database (the last upgrade of the wave + ``soak_s``), so a
  resumed executor soaks what remains, not from zero;
- a failed wave turns the rollout to ``rolling_back`` before anything is rolled back, so a resume finishes
  the rollback instead of carrying on with the next wave; tenants of later waves are never touched.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.errors import InvalidTransition, ValidationFailed
from controlplane.hostpaths import scrub_host_paths
from controlplane.jobs import (
    JobKind,
    WaveEnd,
    WaveFleet,
    WavePlan,
    canary_size,
    job_drive,
    job_kind_register,
    job_start,
    waves_drive,
)
from provisioning.choices import InstanceStatus, ResourceKind
from provisioning.drivers.base import Ref
from provisioning.drivers.pg_admin import tenant_admin_connect
from provisioning.drivers.protocols import Capability
from provisioning.drivers.registry import driver_for, runtime_driver
from provisioning.fleet.actions import RESTARTABLE, actor_from_dict, actor_to_dict
from provisioning.models import AgentInstance, ProvisionedResource
from provisioning.resources import runtime_tables
from provisioning.resources.spec import tenant_spec
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator, Tenant

from .assignments import (
    assignment_switch,
    booted_release,
    step_downtime_ms,
    tenant_release_initial,
    tenant_release_switch,
)
from .choices import (
    ACTIVE_ROLLOUT_STATUSES,
    ROLLOUT_ACTION_STATUSES,
    TOUCHED_ITEM_STATUSES,
    WORKING_ROLLOUT_STATUSES,
    ItemStatus,
    RolloutStatus,
)
from .config_fit import agent_config_misfit
from .models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout, RolloutItem
from .selectors import release_get

__all__ = ["rollout_create", "rollout_pause", "rollout_resume", "rollout_abort", "rollout_rollback",
           "rollout_execute", "tenant_in_active_rollout", "gate_problems", "RELEASE_ROLLOUT_JOBS"]

MAX_WAVE_SIZE = 1000
MAX_SOAK_S = 86_400


def tenant_in_active_rollout(tenant: Tenant) -> bool:
    return RolloutItem.objects.filter(tenant=tenant, rollout__status__in=ACTIVE_ROLLOUT_STATUSES).exists()


def _queue(rollout: Rollout, actor: Actor) -> None:
    job_start(RELEASE_ROLLOUT_JOBS, rollout.pk, params={"actor": actor_to_dict(actor)})


def rollout_create(*, operator: Operator, release_id: object, actor: Actor, canary: int | None = None,
                   canary_percent: float | None = None, wave_size: int | None = None,
                   soak_s: int | None = None) -> Rollout:
    """Plan and start a rollout of one of the operator's releases to every unpinned tenant not on it yet.

    The canary is the first ``canary`` tenants (or ``canary_percent`` of them, at least one), oldest first;
    the rest follow in waves of ``wave_size``. 409 while another rollout of this operator is active.
    """
    release = release_get(operator=operator, release_id=release_id)
    if canary is not None and canary_percent is not None:
        raise ValidationFailed("give canary or canary_percent, not both")
    wave_size = settings.RELEASE_ROLLOUT_WAVE_SIZE if wave_size is None else wave_size
    soak_s = settings.RELEASE_ROLLOUT_SOAK_S if soak_s is None else soak_s
    if not 1 <= wave_size <= MAX_WAVE_SIZE:
        raise ValidationFailed(f"wave_size must be between 1 and {MAX_WAVE_SIZE}")
    if not 0 <= soak_s <= MAX_SOAK_S:
        raise ValidationFailed(f"soak_s must be between 0 and {MAX_SOAK_S}")
    if canary is not None and not 1 <= canary <= MAX_WAVE_SIZE:
        raise ValidationFailed(f"canary must be between 1 and {MAX_WAVE_SIZE}")
    if canary_percent is not None and not 0 < canary_percent <= 100:
        raise ValidationFailed("canary_percent must be more than 0 and at most 100")
    with transaction.atomic():
        targets = []
        for tenant in Tenant.objects.filter(operator=operator, status__in=RESTARTABLE).order_by("created_at", "id"):
            assignment = tenant_release_initial(tenant=tenant)  # no record yet: what it runs, recorded
            if not assignment.pinned and assignment.release_id != release.pk:
                targets.append((tenant, assignment.release_id))
        first = canary_size(len(targets), count=canary, percent=canary_percent,
                            default=settings.RELEASE_ROLLOUT_CANARY)
        waves = WavePlan(size=wave_size, first=first).waves(len(targets))
        try:
            with transaction.atomic():
                default = DefaultRelease.objects.filter(operator=operator).first()
                rollout = Rollout.objects.create(operator=operator, release=release, canary=first,
                                                 wave_size=wave_size, soak_s=soak_s, created_by=actor.label,
                                                 previous_default_id=default.release_id if default else None)
        except IntegrityError:
            raise InvalidTransition("another rollout of yours is active; let it finish, or abort it") from None
        RolloutItem.objects.bulk_create([
            RolloutItem(rollout=rollout, tenant=tenant, from_release_id=previous, wave=wave)
            for wave, (tenant, previous) in zip(waves, targets, strict=True)])
        audit_record(actor=actor, action=AuditAction.ROLLOUT_CREATE, target=rollout, operator=operator, data={
            "version": release.version, "tenants": len(targets), "canary": first, "wave_size": wave_size,
            "soak_s": soak_s})
        _queue(rollout, actor)
    return rollout


# The audit action of each status a staff action moves a rollout to (``_transition``).
_TRANSITION_ACTIONS = {
    RolloutStatus.PAUSED: AuditAction.ROLLOUT_PAUSED,
    RolloutStatus.RUNNING: AuditAction.ROLLOUT_RUNNING,
    RolloutStatus.ABORTED: AuditAction.ROLLOUT_ABORTED,
    RolloutStatus.ROLLING_BACK: AuditAction.ROLLOUT_ROLLING_BACK,
}


def _transition(rollout: Rollout, *, to: RolloutStatus, allowed: tuple[str, ...], actor: Actor, verb: str,
                reason: str = "") -> Rollout:
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if locked.status not in allowed:
            raise InvalidTransition(f"a {locked.status} rollout cannot be {verb}")
        locked.status = to
        locked.reason = reason[:2000]
        locked.finished_at = timezone.now() if to == RolloutStatus.ABORTED else None
        locked.save()
        audit_record(actor=actor, action=_TRANSITION_ACTIONS[to], target=locked, operator=locked.operator,
                     data={"status": to})
        if to in WORKING_ROLLOUT_STATUSES:
            _queue(locked, actor)
    return locked


def rollout_pause(*, rollout: Rollout, actor: Actor) -> Rollout:
    """Stop between tenants: the tenant being upgraded finishes, nothing further starts until resume."""
    return _transition(rollout, to=RolloutStatus.PAUSED, allowed=ROLLOUT_ACTION_STATUSES["pause"], actor=actor,
                       verb="paused", reason=f"paused by {actor.label}")


def rollout_resume(*, rollout: Rollout, actor: Actor) -> Rollout:
    return _transition(rollout, to=RolloutStatus.RUNNING, allowed=ROLLOUT_ACTION_STATUSES["resume"], actor=actor,
                       verb="resumed")


def rollout_abort(*, rollout: Rollout, actor: Actor) -> Rollout:
    """Stop for good: upgraded tenants keep the new release, the others are never touched."""
    return _transition(rollout, to=RolloutStatus.ABORTED, allowed=ROLLOUT_ACTION_STATUSES["abort"],
                       actor=actor, verb="aborted", reason=f"aborted by {actor.label}")


def rollout_rollback(*, rollout: Rollout, actor: Actor) -> Rollout:
    """Return every tenant this rollout upgraded to its previous release (also after it succeeded or was
    aborted, as long as no later rollout of the operator has started since)."""
    later = Rollout.objects.filter(operator_id=rollout.operator_id, created_at__gt=rollout.created_at).exists()
    if later:
        raise InvalidTransition("a later rollout has started since; roll that one out or back instead")
    return _transition(rollout, to=RolloutStatus.ROLLING_BACK,
                       allowed=ROLLOUT_ACTION_STATUSES["rollback"], actor=actor, verb="rolled back",
                       reason=f"rolled back by {actor.label}")


# --- the workflow ---------------------------------------------------------------------------------------


def rollout_execute(rollout_id: str, actor: Actor = SYSTEM) -> str:
    """Run (or resume) a rollout until it finishes, pauses or is aborted. One executor at a time."""
    return job_drive(RELEASE_ROLLOUT_JOBS, rollout_id, {"actor": actor_to_dict(actor)})


def _run(rollout_id: str, actor: dict[str, Any] | None = None) -> str:
    """The kind's body: the kernel holds the lease; ``actor`` is who queued this drive (the sweep: the system)."""
    return _execute(rollout_id, actor_from_dict(actor) if actor else SYSTEM)


def _status(rollout_id: str) -> str:
    return str(Rollout.objects.values_list("status", flat=True).get(pk=rollout_id))


@transaction.atomic
def _finish(rollout_id: str, status: str, reason: str | None = None) -> str:
    """The rollout's end, its default release and its audit row in one transaction: whoever sees the rollout
    succeeded sees the release as the operator's default too (and a crash between them leaves neither)."""
    fields: dict[str, object] = {"status": status, "finished_at": timezone.now(), "updated_at": timezone.now()}
    if reason is not None:
        fields["reason"] = reason[:2000]
    Rollout.objects.filter(pk=rollout_id).update(**fields)
    rollout = Rollout.objects.select_related("operator", "release").get(pk=rollout_id)
    if status == RolloutStatus.SUCCEEDED:
        DefaultRelease.objects.update_or_create(operator=rollout.operator, defaults={"release": rollout.release})
    elif status == RolloutStatus.ROLLED_BACK:
        # A succeeded rollout rolled back: new customers start on what they started on before it, again.
        current = DefaultRelease.objects.filter(operator=rollout.operator, release=rollout.release)
        if rollout.previous_default_id is None:
            current.delete()
        else:
            current.update(release_id=rollout.previous_default_id)
    audit_record(actor=SYSTEM, action=AuditAction.ROLLOUT_FINISH, target=rollout, operator=rollout.operator, data={
        "status": status, "reason": rollout.reason, "version": rollout.release.version})
    return status


def _execute(rollout_id: str, actor: Actor) -> str:
    while True:
        status = _status(rollout_id)
        if status == RolloutStatus.ROLLING_BACK:
            _roll_back(rollout_id, actor)
            return _finish(rollout_id, RolloutStatus.ROLLED_BACK)
        if status != RolloutStatus.RUNNING:
            return status
        rollout = Rollout.objects.select_related("release", "operator").get(pk=rollout_id)
        result = waves_drive(_UpgradeWaves(rollout, actor))
        if result.end == WaveEnd.DONE:
            return _finish(rollout_id, RolloutStatus.SUCCEEDED, reason="")
        if result.end == WaveEnd.FAILED:
            _fail(rollout, result.reason)
        # stopped (paused, aborted) or failed (now rolling back): the loop reads the new status


def _concurrency(rollout: Rollout) -> int:
    return max(1, min(settings.RELEASE_ROLLOUT_CONCURRENCY, rollout.wave_size))


class _UpgradeWaves(WaveFleet[int]):
    """The rollout's items as the wave driver's fleet: a target is an item id, its wave the one planned."""

    def __init__(self, rollout: Rollout, actor: Actor) -> None:
        self.rollout, self.actor = rollout, actor
        self.job_kind, self.job_id = RELEASE_ROLLOUT_JOBS, str(rollout.pk)
        self.concurrency = _concurrency(rollout)
        self.gate_poll_s = settings.RELEASE_GATE_POLL_S
        self.items = RolloutItem.objects.filter(rollout=rollout)

    def proceeding(self) -> bool:
        return _status(self.job_id) == RolloutStatus.RUNNING

    def next_wave(self) -> int | None:
        return (self.items.exclude(status__in=(ItemStatus.SKIPPED, ItemStatus.ROLLED_BACK))
                .filter(upgraded_at__isnull=True).order_by("wave").values_list("wave", flat=True).first())

    def last_wave(self) -> int | None:
        return self.items.order_by("-wave").values_list("wave", flat=True).first()

    def remaining(self, wave: int, limit: int) -> list[int]:
        return list(self.items.filter(wave=wave, status__in=(ItemStatus.PENDING, ItemStatus.UPGRADING))
                    .order_by("id").values_list("pk", flat=True)[:limit])

    def apply(self, target: int) -> None:
        _upgrade_one(target, self.rollout.release, self.actor)

    def record_failure(self, target: int, error: Exception) -> None:
        # The install's or the probe's error names paths on this host (the release's env): its digest instead.
        message = scrub_host_paths(str(error))
        RolloutItem.objects.filter(pk=target).update(status=ItemStatus.FAILED, error=message[:2000])
        # Left stopped (planned) until the rollback restarts it: the sweep must not restart a broken release.
        AgentInstance.objects.filter(tenant_id=RolloutItem.objects.get(pk=target).tenant_id).update(
            status=InstanceStatus.STOPPED, status_reason=f"upgrade failed: {message}"[:2000])

    def wave_failure(self, wave: int) -> str:
        failed = self.items.filter(wave=wave, status=ItemStatus.FAILED).select_related("tenant").first()
        return f"wave {wave} failed: tenant {failed.tenant.slug}: {failed.error}" if failed is not None else ""

    def _soaking(self, wave: int) -> list[RolloutItem]:
        return list(self.items.filter(wave=wave, status=ItemStatus.UPGRADED).select_related("tenant__operator"))

    def gate_deadline(self, wave: int) -> datetime | None:
        """The wave's last upgrade + ``soak_s``: stored, so a resumed driver soaks only what is left."""
        upgraded = [i.upgraded_at for i in self._soaking(wave) if i.upgraded_at]
        return max(upgraded) + timedelta(seconds=self.rollout.soak_s) if upgraded else None

    def gate_problem(self, wave: int) -> str:
        for item in self._soaking(wave):
            problems = gate_problems(item.tenant, started=item.started_at or item.upgraded_at or timezone.now(),
                                     since=item.upgraded_at or timezone.now(), digest=self.rollout.release.digest,
                                     item_id=item.pk)
            if problems:
                RolloutItem.objects.filter(pk=item.pk).update(status=ItemStatus.FAILED,
                                                              error=scrub_host_paths("; ".join(problems)))
                return f"wave {wave} failed its health gate: tenant {item.tenant.slug}: " + "; ".join(problems)
        return ""

    def gate_passed(self, wave: int) -> None:
        for item in self._soaking(wave):
            if item.downtime_ms is None and item.stopped_at is not None:
                downtime = step_downtime_ms(item.tenant, stopped=item.stopped_at)
                if downtime is not None:
                    RolloutItem.objects.filter(pk=item.pk).update(downtime_ms=downtime)


def _fail(rollout: Rollout, reason: str) -> None:
    """The gate failed: from now on the rollout rolls back (committed first, so a resume does too)."""
    reason = scrub_host_paths(reason)  # built from exceptions and probes: no host path in answers or events
    Rollout.objects.filter(pk=rollout.pk, status=RolloutStatus.RUNNING).update(
        status=RolloutStatus.ROLLING_BACK, reason=reason[:2000], updated_at=timezone.now())
    audit_record(actor=SYSTEM, action=AuditAction.ROLLOUT_GATE_FAILED, target=rollout, operator=rollout.operator,
                 data={"reason": reason[:500]})


def _upgrade_one(item_id: int, release: AgentRelease, actor: Actor) -> None:
    """Switch one tenant to ``release`` (an exception is recorded by ``_UpgradeWaves.record_failure``)."""
    item = RolloutItem.objects.select_related("tenant__operator").get(pk=item_id)
    tenant = item.tenant
    assignment = ReleaseAssignment.objects.filter(tenant=tenant).first()
    if tenant.status not in RESTARTABLE or (assignment is not None and assignment.pinned):
        why = "pinned" if assignment is not None and assignment.pinned else tenant.status
        RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.SKIPPED, error=f"left alone: {why}")
        return
    misfit = agent_config_misfit(tenant=tenant, release=release) if item.status == ItemStatus.PENDING else None
    if misfit is not None:  # its agent would get a configuration its own schema refuses: it stays where it is
        error = f"left alone: its configuration does not fit this release: {misfit}"
        RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.SKIPPED, error=error[:2000])
        return
    if item.status == ItemStatus.UPGRADING and item.started_at is not None:
        boots, running = booted_release(tenant, since=item.started_at)
        driver = runtime_driver()
        if boots and (running or {}).get("digest") == release.digest and (
                Capability.PRESENT not in driver.capabilities or driver.present(tenant_spec(tenant))):
            # A killed worker had finished this one: record it, do not restart it again.
            AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.RUNNING, status_reason="")
            RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.UPGRADED, upgraded_at=timezone.now())
            return
    RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.UPGRADING, started_at=timezone.now(),
                                                  upgrades=F("upgrades") + 1)
    stopped = tenant_release_switch(tenant=tenant, release=release, actor=actor,
                                    reason=f"upgrading to release {release.version}")
    RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.UPGRADED, stopped_at=stopped,
                                                  upgraded_at=timezone.now())


def gate_problems(tenant: Tenant, *, started: datetime, since: datetime, digest: str,
                  item_id: int | None = None) -> list[str]:
    """Why the tenant's instance fails the health gate since its upgrade (begun at ``started``, ready at
    ``since``); empty when healthy.

    Ready and healthy (the driver's own probe), booted once on the release and not restarted since, no task
    failed or blocked since, no effect blocked or left in doubt since. Tasks that crossed from the release they
    started on to this one are counted on the rollout item ``item_id`` (docs/releases.md).
    """
    problems = []
    instance = AgentInstance.objects.filter(tenant=tenant).first()
    if instance is None or instance.status != InstanceStatus.RUNNING:
        problems.append(f"instance {instance.status if instance else 'missing'}")
    resource = ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.RUNTIME).first()
    if resource is not None:
        observed = driver_for(ResourceKind.RUNTIME).observe(
            tenant_spec(tenant), Ref(external_id=resource.external_id, details=resource.details))
        if not observed.healthy:
            problems.append(f"unhealthy: {observed.detail}")
    _boots, running = booted_release(tenant, since=started)
    if (running or {}).get("digest") != digest:
        problems.append("not running the release")
    grace = timedelta(seconds=settings.RELEASE_GATE_IN_DOUBT_AFTER_S)
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        schema = tenant.resource_name
        restarts = runtime_tables.restarts_since(conn, schema, since)
        # From the upgrade's start: the new host blocks a task it cannot run right at its boot, before the
        # switch has returned.
        tasks = runtime_tables.task_problems_since(conn, schema, started)
        effects = runtime_tables.effects_in_trouble_since(conn, schema, started, in_doubt_after=grace)
        crossed = runtime_tables.release_crossings_since(conn, schema, started)
    if item_id is not None:  # counted, not a failure: a crossing is declared (version_policy) or asked (a retry)
        RolloutItem.objects.filter(pk=item_id).update(tasks_crossed=crossed)
    if restarts:
        problems.append(f"restarted or crashed {restarts} time(s) since the upgrade")
    for status, reason, count in tasks:
        problems.append(f"{count} task(s) {status}{f' ({reason})' if reason else ''} since the upgrade")
    if effects:
        problems.append(f"{effects} effect(s) blocked or in doubt since the upgrade")
    return problems


class _RollbackWaves(WaveFleet[int]):
    """Every item the rollout touched, as one wave in the order the waves went, ``_concurrency`` at a time."""

    def __init__(self, rollout: Rollout, actor: Actor) -> None:
        self.actor = actor
        self.job_kind, self.job_id = RELEASE_ROLLOUT_JOBS, str(rollout.pk)
        self.concurrency = _concurrency(rollout)
        self.touched = RolloutItem.objects.filter(rollout=rollout, status__in=TOUCHED_ITEM_STATUSES)

    def next_wave(self) -> int | None:
        return 0 if self.touched.exists() else None

    def remaining(self, wave: int, limit: int) -> list[int]:
        return list(self.touched.order_by("wave", "id").values_list("pk", flat=True)[:limit])

    def apply(self, target: int) -> None:
        _roll_back_one(target, self.actor)

    def record_failure(self, target: int, error: Exception) -> None:
        raise error  # not a failed switch (that is recorded on the item): the drive is retried


def _roll_back(rollout_id: str, actor: Actor) -> None:
    """Every tenant this rollout touched goes back to its previous release, concurrently as the waves went."""
    waves_drive(_RollbackWaves(Rollout.objects.get(pk=rollout_id), actor))


def _roll_back_one(item_id: int, actor: Actor) -> None:
    item = RolloutItem.objects.select_related("tenant__operator", "from_release").get(pk=item_id)
    note = item.error
    try:
        if item.tenant.status in RESTARTABLE:
            tenant_release_switch(tenant=item.tenant, release=item.from_release, actor=actor,
                                  reason="rolling back to the previous release")
        else:
            assignment_switch(tenant=item.tenant, release=item.from_release)
    except Exception as exc:  # noqa: BLE001 - the recovery sweep takes the instance from here
        note = scrub_host_paths(f"{note}; rollback did not bring it back: {exc}".strip("; "))
        AgentInstance.objects.filter(tenant=item.tenant).update(
            status=InstanceStatus.FAILED, status_reason=f"rollback failed: {exc}"[:2000])
    RolloutItem.objects.filter(pk=item_id).update(status=ItemStatus.ROLLED_BACK, error=note[:2000],
                                                  rolled_back_at=timezone.now())


# Only working rollouts are driven and swept: a paused one waits for resume (its drive answers "finished").
RELEASE_ROLLOUT_JOBS = job_kind_register(JobKind(
    name="release-rollout", model=Rollout, active_statuses=tuple(WORKING_ROLLOUT_STATUSES), run=_run,
    running_status="", marks_started=False, stall_after_s="RELEASE_ROLLOUT_STALL_AFTER_S",
))
