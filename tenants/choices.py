"""Named statuses, actions and scopes for operators and tenants, and the one table of legal transitions."""

from __future__ import annotations

from django.db import models


class TenantStatus(models.TextChoices):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    READY = "ready"
    DEGRADED = "degraded"
    RECOVERING = "recovering"
    SUSPENDED = "suspended"
    DEPROVISIONING = "deprovisioning"
    DELETED = "deleted"
    FAILED = "failed"


_S = TenantStatus
# Being deleted or deleted: gone for every detail route (tenant, conversations), still listed under its status.
TENANT_GONE = (TenantStatus.DEPROVISIONING, TenantStatus.DELETED)
# The only place tenant lifecycle rules live; services.tenant_transition enforces it.
TENANT_TRANSITIONS: dict[str, frozenset[str]] = {
    _S.PENDING: frozenset({_S.PROVISIONING, _S.FAILED, _S.DEPROVISIONING}),
    _S.PROVISIONING: frozenset({_S.READY, _S.FAILED, _S.DEPROVISIONING}),
    _S.READY: frozenset({_S.DEGRADED, _S.RECOVERING, _S.SUSPENDED, _S.DEPROVISIONING}),
    _S.DEGRADED: frozenset({_S.RECOVERING, _S.READY, _S.SUSPENDED, _S.DEPROVISIONING, _S.FAILED}),
    _S.RECOVERING: frozenset({_S.READY, _S.DEGRADED, _S.FAILED, _S.DEPROVISIONING}),
    _S.SUSPENDED: frozenset({_S.READY, _S.DEPROVISIONING}),
    _S.FAILED: frozenset({_S.PROVISIONING, _S.DEPROVISIONING}),
    _S.DEPROVISIONING: frozenset({_S.DELETED, _S.FAILED}),
    _S.DELETED: frozenset(),
}


class TokenScope(models.TextChoices):
    TENANTS_READ = "tenants:read"
    TENANTS_WRITE = "tenants:write"
    CREDENTIALS_WRITE = "credentials:write"
    # Talking to a tenant's agent (conversations app); the first four can be delegated to customer tokens.
    CONVERSATIONS_READ = "conversations:read"
    CONVERSATIONS_WRITE = "conversations:write"
    TASKS_READ = "tasks:read"
    TASKS_WRITE = "tasks:write"
    EFFECTS_READ = "effects:read"
    EFFECTS_WRITE = "effects:write"
    LOGS_READ = "logs:read"
    CUSTOMER_TOKENS_WRITE = "customer_tokens:write"
    # A customer's connected accounts (connections app), for a customer token: the operator's own tokens use
    # tenants:read and credentials:write there.
    CONNECTIONS_READ = "connections:read"
    CONNECTIONS_WRITE = "connections:write"
    # Events and webhook endpoints (webhooks app).
    EVENTS_READ = "events:read"
    WEBHOOKS_READ = "webhooks:read"
    WEBHOOKS_WRITE = "webhooks:write"
    # The operator's agent releases (releases app).
    RELEASES_READ = "releases:read"
    RELEASES_WRITE = "releases:write"


ALL_TOKEN_SCOPES: tuple[str, ...] = tuple(TokenScope.values)


class ActorKind(models.TextChoices):
    USER = "user"
    TOKEN = "token"
    SYSTEM = "system"
    INSTANCE = "instance"


# Offered on every installation (KUBERNETES_PLANS sizes both); staff add more in the admin. Re-created after a
# migrate or a flush (tenants.apps), never overwritten: a renamed or deactivated default stays as staff left it.
DEFAULT_PLANS: dict[str, tuple[str, str]] = {
    "standard": ("Standard", "The default plan: one instance, 1 CPU, 1 GiB of memory, 5 GiB of storage."),
    "large": ("Large", "2 CPUs, 4 GiB of memory, 50 GiB of storage."),
}
