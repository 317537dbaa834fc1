"""Named kinds, statuses and scopes of the conversation app. No logic here."""

from __future__ import annotations

from django.db import models


class InboxKind(models.TextChoices):
    MESSAGE = "message"
    TASK = "task"
    CANCEL = "cancel"
    DECISION = "decision"
    RETRY = "retry"


class InboxStatus(models.TextChoices):
    PENDING = "pending"  # accepted durably, not yet acknowledged by the instance
    DELIVERED = "delivered"  # the instance answered 2xx (it dedupes by id, so a re-delivery is harmless)
    REFUSED = "refused"  # the instance answered 4xx: the stored problem is the answer


class EffectDecision(models.TextChoices):
    PERFORMED = "performed"
    NOT_PERFORMED = "not_performed"
    PERFORM_NOW = "perform_now"


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    BLOCKED = "blocked"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # a new message with the `interrupt` policy stopped it at a step boundary
    ROLLED_BACK = "rolled_back"  # a new message with the `rollback` policy discarded it (it had no effect)


# What the instance cancels (it answers 409 for a task that already ended): the task page offers Cancel for these.
CANCELLABLE_TASK_STATUSES = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.BLOCKED})


class ThreadPolicy(models.TextChoices):
    """What a message does to its thread's run that is still going (docs/conversations.md)."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


DEFAULT_THREAD_POLICY = ThreadPolicy.ENQUEUE


class EffectState(models.TextChoices):
    OPEN = "open"
    IN_DOUBT = "in_doubt"
    BLOCKED = "blocked"
    COMMITTED = "committed"
    FAILED = "failed"
    ALL = "all"


class LogLevel(models.TextChoices):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


# What an operator may delegate to a customer token (never tenants, credentials, effects or logs).
CUSTOMER_TOKEN_SCOPES: tuple[str, ...] = ("conversations:read", "conversations:write", "tasks:read", "tasks:write",
                                          "connections:read", "connections:write")
CUSTOMER_TOKEN_PREFIX = "ctk"
CUSTOMER_TOKEN_TTL_DEFAULT_S = 900
CUSTOMER_TOKEN_TTL_MAX_S = 86_400
CUSTOMER_TOKEN_TTL_MIN_S = 60
