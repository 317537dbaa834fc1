"""Key rotation as resumable jobs: progress committed in Postgres, one unit of work per transaction.

``kek`` jobs re-wrap every data key under the newest key-encryption key (no credential is
decrypted), then every secret a feature keeps wrapped by the KEK itself (``vault.wrapped_secrets``: OAuth client
secrets). ``data_key`` jobs give a tenant a new data-key version, re-encrypt each credential
version under it, then retire the older versions (kept, wrapped, so a reader that fetched an
old ciphertext a moment before still opens it; ``vault.shredding`` destroys them after a grace period).
Destroyed keys are never re-wrapped: there is nothing left to unwrap. Each unit first checks whether it is already
done (the row's ``kek_id`` / ``data_key_version``), so a worker killed anywhere - even between
the effect and the progress update, which share one transaction anyway - resumes without harm.

Object keys (purpose ``objects``) are never re-encrypted here: the control plane does not hold
the objects. A new version encrypts new objects and the older versions stay readable (retired,
never destroyed while the tenant exists, see docs/vault.md); the instance gets all of them from ``tenant_object_keys``.
No HTTP here; tasks and admin actions call these functions.

A rotation job is a kind of the job kernel (``controlplane.jobs``, kind ``vault-rotation``): the kernel holds
the lease (one driver per job), marks it running, records each unit's progress with its heartbeat, resumes it
from the one stall sweep after ``VAULT_ROTATION_STALL_AFTER_S``, and sleeps the test-only pause
``VAULT_ROTATION_PAUSE_PER_ITEM_S``. What is left here is what rotation itself decides.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.errors import ApplicationError, Conflict, DecryptionFailed, ValidationFailed
from controlplane.jobs import JobKind, cursor_batches, job_drive, job_kind_register, job_pause, job_progress, job_start
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Tenant

from .choices import ACTIVE_ROTATION_STATUSES, KeyPurpose, KeyStatus, RotationKind, RotationStatus
from .envelope import credential_aad, new_key, open_sealed, seal
from .kek import kek_provider, kek_unwrap
from .models import CredentialVersion, RotationJob, TenantDataKey
from .services import _unwrap
from .wrapped_secrets import wrapped_secrets_sources

__all__ = [
    "Outcome",
    "kek_rotate_start",
    "data_key_rotate_start",
    "rotation_job_execute",
    "rotation_job_resume",
    "ROTATION_JOBS",
]

log = logging.getLogger(__name__)

_BATCH = 200
# The audit actions of retrying and finishing each kind of rotation job.
_RETRY_ACTIONS = {RotationKind.KEK: AuditAction.VAULT_KEK_ROTATION_RETRY,
                  RotationKind.DATA_KEY: AuditAction.VAULT_DATA_KEY_ROTATION_RETRY}
_FINISH_ACTIONS = {RotationKind.KEK: AuditAction.VAULT_KEK_ROTATION_FINISH,
                   RotationKind.DATA_KEY: AuditAction.VAULT_DATA_KEY_ROTATION_FINISH}
_MAX_PASSES = 5


class Outcome:
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BUSY = "busy"  # another worker is executing this job (the kernel's answer)
    FINISHED = "finished"  # nothing to do (the kernel's answer)


class _Failed(ApplicationError):
    pass


def _enqueue(job: RotationJob) -> None:
    job_start(ROTATION_JOBS, job.pk)


def _serialize_starts() -> None:
    """Starts of rotations run one at a time (transaction-scoped lock), so two never race."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('vault-rotation-start'))")


def _active_job(kind: str, tenant: Tenant | None, purpose: str) -> RotationJob | None:
    return RotationJob.objects.select_for_update().filter(
        kind=kind, tenant=tenant, purpose=purpose, status__in=ACTIVE_ROTATION_STATUSES
    ).first()


def kek_rotate_start(*, actor: Actor) -> RotationJob:
    """Ensure a KEK rotation to the configured provider's newest key is queued (idempotent).

    An unfinished KEK job is queued again and returned instead of starting a second one.
    """
    target = kek_provider().current_kek_id()
    with transaction.atomic():
        _serialize_starts()
        job = _active_job(RotationKind.KEK, None, "")
        if job is None:
            stale = _rewrappable().exclude(kek_id=target)
            replaced = sorted(set(stale.values_list("kek_id", flat=True)))
            job = RotationJob.objects.create(
                kind=RotationKind.KEK, target=target, total=stale.count(),
                details={"replaced_kek_ids": replaced}, requested_by=actor.label[:200],
            )
            audit_record(actor=actor, action=AuditAction.VAULT_KEK_ROTATION_START, target=job,
                         data={"target": target, "replaced_kek_ids": replaced, "total": job.total})
        _enqueue(job)
    return job


def data_key_rotate_start(*, tenant: Tenant, actor: Actor, purpose: str = KeyPurpose.CREDENTIALS) -> RotationJob:
    """Ensure a rotation of ``tenant``'s data key is queued; the new version encrypts from now on.

    The new key version is created here, in the same transaction as the job, so a re-run
    never creates a second one; an unfinished job for the same scope is returned instead.
    """
    if purpose not in KeyPurpose.values:
        raise ValidationFailed(f"purpose must be one of: {', '.join(KeyPurpose.values)}")
    from .services import _check_tenant_open

    _check_tenant_open(tenant)
    provider = kek_provider()
    with transaction.atomic():
        _serialize_starts()
        job = _active_job(RotationKind.DATA_KEY, tenant, purpose)
        if job is None:
            Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
            keys = TenantDataKey.objects.filter(tenant=tenant, purpose=purpose)
            previous = sorted(keys.filter(status=KeyStatus.ACTIVE).values_list("version", flat=True))
            version = max(keys.values_list("version", flat=True), default=0) + 1
            wrapped = provider.wrap(str(tenant.pk), new_key())
            TenantDataKey.objects.create(
                tenant=tenant, purpose=purpose, version=version, kek_id=wrapped.kek_id,
                kek_fingerprint=wrapped.fingerprint, wrapped_key=wrapped.blob,
            )
            total = 0
            if purpose == KeyPurpose.CREDENTIALS:
                total = CredentialVersion.objects.filter(credential__tenant=tenant).count()
            job = RotationJob.objects.create(
                kind=RotationKind.DATA_KEY, tenant=tenant, purpose=purpose, target=str(version), total=total,
                details={"previous_versions": previous}, requested_by=actor.label[:200],
            )
            audit_record(actor=actor, action=AuditAction.VAULT_DATA_KEY_ROTATION_START, target=job, tenant=tenant,
                         data={"purpose": purpose, "version": version, "previous_versions": previous})
        _enqueue(job)
    return job


def rotation_job_resume(*, job: RotationJob, actor: Actor) -> RotationJob:
    """Queue an unfinished job again, or give a failed one another go (staff action, re-runs)."""
    with transaction.atomic():
        job = RotationJob.objects.select_for_update().get(pk=job.pk)
        if job.status == RotationStatus.SUCCEEDED:
            raise Conflict("this rotation has already succeeded")
        if job.status == RotationStatus.FAILED:
            if _active_job(job.kind, job.tenant, job.purpose) is not None:
                raise Conflict("another rotation of the same keys is in progress")
            job.status = RotationStatus.PENDING
            job.error = ""
            job.finished_at = None
            try:
                with transaction.atomic():
                    job.save(update_fields=["status", "error", "finished_at", "updated_at"])
            except IntegrityError:
                raise Conflict("another rotation of the same keys is in progress") from None
            audit_record(actor=actor, action=_RETRY_ACTIONS[RotationKind(job.kind)], target=job, tenant=job.tenant)
        _enqueue(job)
    return job


# --- execution ---------------------------------------------------------------------------------------


def rotation_job_execute(job_id: str) -> str:
    """Execute or resume a rotation job. Safe to call any number of times, from any worker."""
    return job_drive(ROTATION_JOBS, job_id)


def _run(job_id: str) -> str:
    """The kind's body: the kernel holds the lease and has marked the job running."""
    job = RotationJob.objects.select_related("tenant", "tenant__operator").get(pk=job_id)
    log.info("rotation job %s (%s) resuming at %s/%s", job.pk, job.kind, job.done, job.total)
    try:
        if job.kind == RotationKind.KEK:
            _run_kek(job)
        elif job.purpose == KeyPurpose.CREDENTIALS:
            _run_credentials_key(job)
        else:
            _retire_old_keys(job)
    except ApplicationError as exc:
        _finish(job, RotationStatus.FAILED, exc.detail)
        return Outcome.FAILED
    _finish(job, RotationStatus.SUCCEEDED)
    return Outcome.SUCCEEDED


ROTATION_JOBS = job_kind_register(JobKind(
    name="vault-rotation", model=RotationJob, active_statuses=tuple(ACTIVE_ROTATION_STATUSES), run=_run,
    running_status=RotationStatus.RUNNING, stall_after_s="VAULT_ROTATION_STALL_AFTER_S",
    pause_setting="VAULT_ROTATION_PAUSE_PER_ITEM_S",
))


def _pause() -> None:
    job_pause(ROTATION_JOBS)  # chaos tests SIGKILL the worker here


def _advance(job: RotationJob, row_id: int) -> None:
    job_progress(ROTATION_JOBS, job.pk, values={"cursor": row_id}, add={"done": 1})
    job.cursor = row_id


def _run_kek(job: RotationJob) -> None:
    provider = kek_provider()
    if provider.current_kek_id() != job.target:
        raise _Failed(
            f"the configured key-encryption key is now {provider.current_kek_id()!r}, not this job's target "
            f"{job.target!r}: start a new rotation"
        )
    stale = _rewrappable().exclude(kek_id=job.target)
    for _ in range(_MAX_PASSES):
        for key_id in cursor_batches(lambda after: stale.filter(id__gt=after).order_by("id")
                                     .values_list("id", flat=True)[:_BATCH], cursor=job.cursor, key=int):
            _rewrap_one(job, key_id, provider)
            _pause()
        if not _rewrappable().exclude(kek_id=job.target).exists():
            _rewrap_wrapped_secrets(job)
            return
        job.cursor = 0  # something behind the cursor changed (e.g. a concurrent provider change): sweep again
    raise _Failed("data keys keep appearing under another key-encryption key; check the configuration")


def _rewrap_wrapped_secrets(job: RotationJob) -> None:
    """The features' KEK-wrapped secrets, after the data keys. Each source is idempotent, so a job resumed after a
    kill simply asks every source again; the counts go in the job's details."""
    counts = {source.name: source.rewrap(job.target) for source in wrapped_secrets_sources()}
    with transaction.atomic():
        locked = RotationJob.objects.select_for_update().get(pk=job.pk)
        merged = dict(locked.details.get("rewrapped_secrets") or {})
        for name, count in counts.items():
            merged[name] = merged.get(name, 0) + count
        locked.details = {**locked.details, "rewrapped_secrets": merged}
        locked.save(update_fields=["details"])


def _rewrappable() -> QuerySet[TenantDataKey]:
    """Data keys a KEK rotation re-wraps: a destroyed key has no wrapped bytes left (and must never get new ones)."""
    return TenantDataKey.objects.exclude(status=KeyStatus.DESTROYED)


def _rewrap_one(job: RotationJob, key_id: int, provider: object) -> None:
    with transaction.atomic():
        key = TenantDataKey.objects.select_for_update().get(pk=key_id)
        if key.kek_id != job.target and key.status != KeyStatus.DESTROYED:  # destroyed since the batch was read
            plain = kek_unwrap(str(key.tenant_id), key.wrapped)
            wrapped = provider.wrap(str(key.tenant_id), plain)  # type: ignore[attr-defined]
            key.kek_id, key.kek_fingerprint, key.wrapped_key = wrapped.kek_id, wrapped.fingerprint, wrapped.blob
            key.save(update_fields=["kek_id", "kek_fingerprint", "wrapped_key"])
        _advance(job, key_id)


def _run_credentials_key(job: RotationJob) -> None:
    assert job.tenant is not None
    target = int(job.target)
    new_key_row = TenantDataKey.objects.get(tenant=job.tenant, purpose=KeyPurpose.CREDENTIALS, version=target)
    if new_key_row.status != KeyStatus.ACTIVE:
        raise _Failed(f"data key version {target} was retired before this rotation finished")
    pending = CredentialVersion.objects.filter(credential__tenant=job.tenant).exclude(data_key_version=target)
    for _ in range(_MAX_PASSES):
        for row_id in cursor_batches(lambda after: pending.filter(id__gt=after).order_by("id")
                                     .values_list("id", flat=True)[:_BATCH], cursor=job.cursor, key=int):
            _reencrypt_one(job, row_id, new_key_row)
            _pause()
        if _retire_old_keys(job):
            return
        job.cursor = 0  # a writer used the old key after we passed it: sweep again
    raise _Failed("credentials keep being written under an old data key; try again later")


def _reencrypt_one(job: RotationJob, row_id: int, new_key_row: TenantDataKey) -> None:
    tenant = job.tenant
    assert tenant is not None
    with transaction.atomic():
        row = CredentialVersion.objects.select_for_update().select_related("credential").get(pk=row_id)
        if row.data_key_version != new_key_row.version:
            old_key_row = TenantDataKey.objects.get(
                tenant=tenant, purpose=KeyPurpose.CREDENTIALS, version=row.data_key_version
            )
            # Same associated data: the binding is to (tenant, name, version), not to the data key.
            aad = credential_aad(str(tenant.pk), row.credential.name, row.version)
            try:
                plain = open_sealed(_unwrap(old_key_row), bytes(row.ciphertext), aad)
            except DecryptionFailed:  # not KeyRingMismatch: that fails the job with its own message
                raise _Failed(
                    f"credential {row.credential.name!r} version {row.version} failed authentication; "
                    "it was tampered with or moved - investigate before rotating again"
                ) from None
            row.ciphertext = seal(_unwrap(new_key_row), plain, aad)
            del plain
            row.data_key_version = new_key_row.version
            row.save(update_fields=["ciphertext", "data_key_version"])
        _advance(job, row_id)


def _retire_old_keys(job: RotationJob) -> bool:
    """Retire every other active version of the job's key, unless a credential still uses one."""
    target = int(job.target)
    with transaction.atomic():
        old = list(
            TenantDataKey.objects.select_for_update()
            .filter(tenant=job.tenant, purpose=job.purpose, status=KeyStatus.ACTIVE)
            .exclude(version=target).values_list("version", flat=True)
        )
        if job.purpose == KeyPurpose.CREDENTIALS and CredentialVersion.objects.filter(
            credential__tenant=job.tenant, data_key_version__in=old
        ).exists():
            return False
        TenantDataKey.objects.filter(tenant=job.tenant, purpose=job.purpose, version__in=old).update(
            status=KeyStatus.RETIRED, retired_at=timezone.now()
        )
        details = {**job.details, "retired_versions": sorted(set(job.details.get("retired_versions", [])) | set(old))}
        RotationJob.objects.filter(pk=job.pk).update(details=details)
        job.details = details
    return True


def _finish(job: RotationJob, status: str, error: str = "") -> None:
    with transaction.atomic():
        job.refresh_from_db(fields=["done", "cursor", "details"])
        job.status = status
        job.error = error[:2000]
        job.finished_at = timezone.now()
        job.save(update_fields=["status", "error", "finished_at", "updated_at"])
        data = {"status": status, "target": job.target, "done": job.done}
        if job.kind == RotationKind.KEK:
            from .selectors import kek_ids_in_use

            data["kek_ids_in_use"] = kek_ids_in_use()
        else:
            data["retired_versions"] = job.details.get("retired_versions", [])
        if error:
            data["error"] = error[:500]
        audit_record(actor=SYSTEM, action=_FINISH_ACTIONS[RotationKind(job.kind)], target=job, tenant=job.tenant,
                     data=data)
    log.info("rotation job %s (%s) %s: %s/%s", job.pk, job.kind, status, job.done, job.total)
