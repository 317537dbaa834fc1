"""Instance identity for the internal endpoints: token verification, the instance actor, heartbeats.

An instance token is a 256-bit random value generated at provisioning (kept in the vault as
``system.instance-token``); only its SHA-256 is on ``AgentInstance.token_hash``. A fast hash
is enough for random tokens; the final compare is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from provisioning.models import AgentInstance
from provisioning.recovery.heartbeats import heartbeat_record
from tenants.actors import Actor
from tenants.choices import ActorKind, TenantStatus

__all__ = ["instance_verify", "instance_actor", "instance_heartbeat_record"]

# Operator API tokens look like this; never accepted here, whatever their hash.
_OPERATOR_TOKEN_PREFIX = "cpk_"
_REFUSED_TENANT_STATES = (TenantStatus.DEPROVISIONING, TenantStatus.DELETED)


def instance_verify(raw: str) -> AgentInstance | None:
    """The live instance whose token is ``raw``, or None. Never says what was wrong."""
    if not raw or raw.startswith(_OPERATOR_TOKEN_PREFIX) or len(raw) > 512:
        return None
    digest = hashlib.sha256(raw.encode()).hexdigest()
    instance = (AgentInstance.objects.select_related("tenant", "tenant__operator")
                .filter(token_hash=digest).first())
    if instance is None or not hmac.compare_digest(instance.token_hash, digest):
        return None
    if instance.tenant.status in _REFUSED_TENANT_STATES:
        return None
    return instance


def instance_actor(instance: AgentInstance) -> Actor:
    return Actor(
        kind=ActorKind.INSTANCE, id=str(instance.pk), label=f"instance of {instance.tenant}"[:200],
        operator_id=str(instance.tenant.operator_id),
    )


def instance_heartbeat_record(*, instance: AgentInstance, progress: dict[str, Any]) -> None:
    """Record liveness and progress in the heartbeat store (Redis when configured). Not audited."""
    heartbeat_record(instance_id=str(instance.pk), progress=progress)
