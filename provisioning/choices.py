"""Named kinds and statuses for provisioned resources, instances and workflows."""

from __future__ import annotations

from django.db import models


class ResourceKind(models.TextChoices):
    DATABASE = "database"
    VOLUME = "volume"
    OBJECTSTORE = "objectstore"
    VAULT = "vault"
    RUNTIME = "runtime"


class ResourceStatus(models.TextChoices):
    PROVISIONING = "provisioning"
    READY = "ready"
    # The runtime while a recovery stops, repairs, starts and verifies it: not "ready" until it resumed.
    RECOVERING = "recovering"
    MISSING = "missing"
    DELETED = "deleted"
    FAILED = "failed"


class InstanceStatus(models.TextChoices):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    # Stopped cleanly after INSTANCE_IDLE_SUSPEND_S without activity (provisioning/fleet/sleep.py); the next message or
    # task wakes it. Not meant to run, so the recovery sweep, the exit notice and the pod watcher leave it alone.
    ASLEEP = "asleep"
    RECOVERING = "recovering"
    QUARANTINED = "quarantined"
    FAILED = "failed"


class WorkflowKind(models.TextChoices):
    ONBOARD = "onboard"
    DEPROVISION = "deprovision"
    RECOVER = "recover"
    MOVE = "move"  # a tenant's schema to another database server (provisioning/databases/move.py)


class RecoveryReason(models.TextChoices):
    DEAD = "dead"  # no heartbeat within the timeout and the process/pod is gone
    OOM = "oom"  # gone, killed by the kernel for going past its plan's memory (the cgroup's OOM count rose)
    HUNG = "hung"  # alive (or silent but present) while its progress marker has not moved
    DRIFT = "drift"  # a provisioned resource is missing or changed
    UNHEALTHY = "unhealthy"  # running but failing /healthz (e.g. after a deploy)
    MANUAL = "manual"  # staff asked for it


class RecoveryOutcome(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    QUARANTINED = "quarantined"


class WorkflowStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ReleaseArtifact(models.TextChoices):
    """What an operator's release is, by the runtime driver that runs it (``release_artifact`` on each)."""

    WHEEL = "wheel"  # the local process driver: installed on this machine, loaded from its directory
    IMAGE = "image"  # the Kubernetes driver: the pod's container image, pinned by digest


class DatabaseServerState(models.TextChoices):
    """Whether new tenants may be placed on a tenant database server; its existing tenants stay either way."""

    ACTIVE = "active"
    DRAINING = "draining"  # takes no new tenants (full, being retired, or no longer what TENANT_DATABASE_URL names)


class WakeOutcome(models.TextChoices):
    """How one wake of an asleep instance ended (``InstanceWake.outcome``)."""

    PENDING = "pending"  # requested; the boot has not finished
    SUCCEEDED = "succeeded"  # the instance is up and read back
    FAILED = "failed"  # the boot failed: the instance is marked failed and the recovery sweep takes it
    CANCELLED = "cancelled"  # nothing to wake any more (stopped on purpose, suspended, deprovisioned, awake already)
