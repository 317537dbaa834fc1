"""A customer's agent configuration: its release's defaults with the operator's overrides for that customer on top.

Services and selectors only (no HTTP here). The effective configuration is a shallow merge: each top-level key the
overrides hold replaces the release default's value. Overrides are validated on write against the schema of the
release the tenant runs (``releases.config_schema``), and every credential property (``"format": "credential"``)
must name a credential the tenant's vault holds: the configuration carries names, never secret values; the agent
asks the vault for the value at the moment of use (``ctx.credentials.get(name)`` / ``ctx.config_credential``).
The reserved key ``effects`` names the customer's own effect providers and is checked by the runtime's rules
(``releases.effects_config``), not by the schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from controlplane.db.rows import model_columns, model_row
from controlplane.errors import ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Tenant
from vault.selectors import credential_list

from .assignments import tenant_release_seen
from .config_schema import config_validate, credential_fields
from .effects_config import effects_config_check
from .models import AgentRelease, ReleaseAssignment, TenantAgentConfig
from .services import MAX_CONFIG_BYTES

__all__ = ["AgentConfigView", "tenant_agent_config_effective", "tenant_agent_config_get", "tenant_agent_config_set"]


@dataclass(frozen=True)
class AgentConfigView:
    """What the API and the portal show, and what the instance is given (``effective``)."""

    tenant_id: object
    release: AgentRelease | None
    schema: dict[str, Any] | None
    defaults: dict[str, Any]
    overrides: dict[str, Any]
    effective: dict[str, Any]
    credential_fields: list[str]
    updated_at: datetime | None


def _release_of(tenant: Tenant) -> AgentRelease | None:
    assignment = tenant_release_seen(tenant)
    return assignment.release if assignment.release_id is not None else None


def _release_and_overrides(tenant: Tenant) -> tuple[AgentRelease | None, TenantAgentConfig | None]:
    """The tenant's release and its overrides row in one parameterised statement: the instance asks for its
    configuration once per task (`tenant_agent_config_effective`), and the ORM's two queries cost more CPU to build
    than their round trips (issue 39). A tenant with no assignment recorded yet takes the longer way
    (`tenant_release_seen`: what it would run)."""
    r_fields, r_cols = model_columns(AgentRelease, "r")
    c_fields, c_cols = model_columns(TenantAgentConfig, "c")
    sql = (f"SELECT a.tenant_id IS NOT NULL, r.id IS NOT NULL, c.tenant_id IS NOT NULL, {r_cols}, {c_cols}"  # noqa: S608
           f" FROM (SELECT 1) AS one LEFT JOIN {ReleaseAssignment._meta.db_table} a ON a.tenant_id = %s"
           f" LEFT JOIN {AgentRelease._meta.db_table} r ON r.id = a.release_id"
           f" LEFT JOIN {TenantAgentConfig._meta.db_table} c ON c.tenant_id = %s")
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant.pk, tenant.pk])
        row = cursor.fetchone()
    assigned, has_release, has_overrides = row[0], row[1], row[2]
    if assigned:
        release = model_row(AgentRelease, r_fields, row, 3) if has_release else None
    else:
        release = _release_of(tenant)
    config = model_row(TenantAgentConfig, c_fields, row, 3 + len(r_fields)) if has_overrides else None
    return release, config


def tenant_agent_config_get(*, tenant: Tenant) -> AgentConfigView:
    """The tenant's configuration as its next task will get it (its release's defaults, then its overrides)."""
    release, row = _release_and_overrides(tenant)
    defaults = dict(release.default_config) if release is not None else {}
    overrides = dict(row.overrides) if row is not None else {}
    schema = release.config_schema if release is not None else None
    return AgentConfigView(tenant_id=tenant.pk, release=release, schema=schema, defaults=defaults,
                           overrides=overrides, effective={**defaults, **overrides},
                           credential_fields=credential_fields(schema), updated_at=row.updated_at if row else None)


def tenant_agent_config_effective(tenant: Tenant) -> dict[str, Any]:
    """What the tenant's instance gets for its next task (registered with provisioning.resources.contributions)."""
    return tenant_agent_config_get(tenant=tenant).effective


def _check_credentials(*, tenant: Tenant, named: dict[str, Any]) -> None:
    """400 naming the field unless every credential name (by its field, e.g. ``overrides.openai_key`` or
    ``overrides.effects.payment.bearer_credential``) is one the tenant's vault holds now."""
    if not named:
        return
    for field, name in named.items():
        if not isinstance(name, str) or not name:
            raise ValidationFailed(f"{field}: a credential property holds the name of a credential in the "
                                   "customer's vault (a string), never its value", extra={"field": field})
    held = set(credential_list(tenant=tenant).filter(revoked_at__isnull=True, consumed_at__isnull=True,
                                                     name__in=list(named.values())).values_list("name", flat=True))
    for field, name in sorted(named.items()):
        if name not in held:
            # The name is the operator's own input and not a secret: saying which one is missing is safe.
            raise ValidationFailed(f"{field}: the customer's vault holds no credential named {name[:100]!r}; "
                                   "store it first (PUT /api/v1/tenants/{id}/credentials/{name})",
                                   extra={"field": field})


def tenant_agent_config_set(*, tenant: Tenant, overrides: object, actor: Actor) -> AgentConfigView:
    """Replace the tenant's overrides (400 naming the field unless the effective configuration fits the schema of
    the release it runs), audited. The next task of its instance starts with the new configuration."""
    if not isinstance(overrides, dict):
        raise ValidationFailed("overrides must be a JSON object", extra={"field": "overrides"})
    if len(json.dumps(overrides)) > MAX_CONFIG_BYTES:
        raise ValidationFailed(f"overrides must be at most {MAX_CONFIG_BYTES} bytes of JSON",
                               extra={"field": "overrides"})
    current = tenant_agent_config_get(tenant=tenant)
    # Validated as the instance will see it (a required property may come from the defaults), reported against
    # what was sent: the defaults passed the same schema at upload, so the offending field is an override.
    config_validate(current.schema, {**current.defaults, **overrides}, root="overrides")
    named = effects_config_check(overrides, root="overrides")
    named.update({f"overrides.{f}": overrides[f] for f in current.credential_fields if f in overrides})
    _check_credentials(tenant=tenant, named=named)
    with transaction.atomic():
        row, _created = TenantAgentConfig.objects.select_for_update().get_or_create(tenant=tenant)
        before = sorted(row.overrides)
        row.overrides = overrides
        row.updated_by = actor.label
        row.save(update_fields=["overrides", "updated_by", "updated_at"])
        # Keys only: a configuration value is the operator's data, and the audit log is not where it is kept.
        audit_record(actor=actor, action=AuditAction.AGENT_CONFIG_UPDATE, target=row, tenant=tenant, data={
            "keys": sorted(overrides), "removed": sorted(set(before) - set(overrides)),
            "release": str(current.release.pk) if current.release is not None else None})
    return tenant_agent_config_get(tenant=tenant)
