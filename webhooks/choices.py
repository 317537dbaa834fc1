"""Public event types, endpoint and delivery statuses. The event type namespace is part of the API."""

from __future__ import annotations

from django.db import models


class EventType(models.TextChoices):
    TENANT_CREATED = "tenant.created"
    TENANT_UPDATED = "tenant.updated"
    TENANT_PROVISIONING = "tenant.provisioning"
    TENANT_READY = "tenant.ready"
    TENANT_DEGRADED = "tenant.degraded"
    TENANT_RECOVERING = "tenant.recovering"
    TENANT_SUSPENDED = "tenant.suspended"
    TENANT_RESUMED = "tenant.resumed"
    TENANT_FAILED = "tenant.failed"
    TENANT_DEPROVISIONING = "tenant.deprovisioning"
    TENANT_DELETED = "tenant.deleted"
    INSTANCE_STARTED = "instance.started"
    INSTANCE_STOPPED = "instance.stopped"
    INSTANCE_KILLED = "instance.killed"
    INSTANCE_RESTARTED = "instance.restarted"
    RECOVERY_STARTED = "recovery.started"
    RECOVERY_SUCCEEDED = "recovery.succeeded"
    RECOVERY_FAILED = "recovery.failed"
    RECOVERY_QUARANTINED = "recovery.quarantined"
    TASK_SUBMITTED = "task.submitted"
    TASK_CANCEL_REQUESTED = "task.cancel_requested"
    # Read from the instance's own tables by the webhooks sweep (``webhooks.runtime_events``), not from the audit
    # trail: the instance, not the control plane, finishes a task and commits a reply.
    TASK_SUCCEEDED = "task.succeeded"
    TASK_BLOCKED = "task.blocked"
    TASK_FAILED = "task.failed"
    MESSAGE_REPLIED = "message.replied"
    EFFECT_DECIDED = "effect.decided"
    CONNECTION_CREATED = "connection.created"
    CONNECTION_NEEDS_REAUTH = "connection.needs_reauth"
    CONNECTION_DISCONNECTED = "connection.disconnected"
    # Sent by the "test" button/endpoint to one endpoint only. ``release.*`` is reserved for agent
    # releases (issue 14) and has no types yet.
    WEBHOOK_TEST = "webhook.test"


# The types ``webhooks.runtime_events`` detects in an instance's tables (no audit action makes them).
RUNTIME_EVENT_TYPES: frozenset[str] = frozenset({EventType.TASK_SUCCEEDED, EventType.TASK_BLOCKED,
                                                 EventType.TASK_FAILED, EventType.MESSAGE_REPLIED})
# Prefixes a filter may name as ``<prefix>.*`` (release is reserved: a filter on it matches nothing yet).
EVENT_TYPE_PREFIXES: frozenset[str] = frozenset(t.split(".", 1)[0] for t in EventType.values) | {"release"}
# What a filter or an endpoint's event_types may name: an exact type or `<prefix>.*` (the schema's enum).
EVENT_TYPE_FILTERS: tuple[str, ...] = (*sorted(EventType.values), *sorted(f"{p}.*" for p in EVENT_TYPE_PREFIXES))


class EndpointStatus(models.TextChoices):
    ACTIVE = "active"
    # The last delivery exhausted its retry schedule; deliveries continue, and one success clears it.
    FAILING = "failing"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the retry schedule is exhausted; replay queues it again
    CANCELLED = "cancelled"  # its endpoint was deleted before it was delivered
