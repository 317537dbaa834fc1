"""Instance identity for the internal endpoints: token verification, the instance actor, heartbeats.

An instance token is a 256-bit random value generated at provisioning (kept in the vault as
``system.instance-token``); only its SHA-256 is on ``AgentInstance.token_hash``. A fast hash
is enough for random tokens; the final compare is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from django.db import connection

from controlplane.db.rows import model_columns, model_row
from provisioning.models import AgentInstance
from provisioning.recovery.heartbeats import heartbeat_record
from tenants.actors import Actor
from tenants.choices import ActorKind, TenantStatus
from tenants.models import Operator, Tenant

__all__ = ["instance_verify", "instance_actor", "instance_heartbeat_record"]

# Operator API tokens look like this; never accepted here, whatever their hash.
_OPERATOR_TOKEN_PREFIX = "cpk_"
_REFUSED_TENANT_STATES = (TenantStatus.DEPROVISIONING, TenantStatus.DELETED)


def instance_verify(raw: str) -> AgentInstance | None:
    """The live instance whose token is ``raw``, or None. Never says what was wrong.

    Every call an instance makes (heartbeats, its configuration once per task, credentials) starts here, so the
    instance, its tenant and the operator are read by one parameterised statement (`controlplane.db.rows`): the
    ORM's `select_related` cost more CPU to build than the round trip (issue 39). Never cached: a new token or a
    tenant being deleted counts from the next call on."""
    if not raw or raw.startswith(_OPERATOR_TOKEN_PREFIX) or len(raw) > 512:
        return None
    digest = hashlib.sha256(raw.encode()).hexdigest()
    i_fields, i_cols = model_columns(AgentInstance, "i")
    t_fields, t_cols = model_columns(Tenant, "t")
    o_fields, o_cols = model_columns(Operator, "o")
    sql = (f"SELECT {i_cols}, {t_cols}, {o_cols} FROM {AgentInstance._meta.db_table} i "  # noqa: S608 - metadata names
           f"JOIN {Tenant._meta.db_table} t ON t.id = i.tenant_id JOIN {Operator._meta.db_table} o"
           " ON o.id = t.operator_id WHERE i.token_hash = %s LIMIT 1")
    with connection.cursor() as cursor:
        cursor.execute(sql, [digest])
        row = cursor.fetchone()
    if row is None:
        return None
    instance = model_row(AgentInstance, i_fields, row)
    if not hmac.compare_digest(instance.token_hash, digest):
        return None
    tenant = model_row(Tenant, t_fields, row, len(i_fields))
    tenant.operator = model_row(Operator, o_fields, row, len(i_fields) + len(t_fields))
    instance.tenant = tenant
    if tenant.status in _REFUSED_TENANT_STATES:
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
