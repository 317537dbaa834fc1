"""Whether a customer's configuration fits a release it is about to run (issue 32).

Overrides are validated on write against the schema of the release the tenant runs then. A later release may
declare another schema (a property renamed, a type narrowed): moving the tenant there would hand its agent a
configuration its own schema refuses. So a switch checks first: a pin is refused (400 naming the field), and a
rollout leaves that tenant on its release (its item skipped, saying which field) while the others move on.
"""

from __future__ import annotations

from controlplane.errors import ValidationFailed
from tenants.models import Tenant

from .config_schema import config_validate
from .models import AgentRelease, TenantAgentConfig

__all__ = ["agent_config_misfit"]


def agent_config_misfit(*, tenant: Tenant, release: AgentRelease | None) -> str | None:
    """Why the tenant's overrides over ``release``'s defaults break ``release``'s schema (``overrides.<field>:
    <rule>``), or None when they fit (or there is no release, no schema, or no override)."""
    if release is None:
        return None
    row = TenantAgentConfig.objects.filter(tenant=tenant).only("overrides").first()
    if row is None or not row.overrides:
        return None
    try:
        config_validate(release.config_schema, {**release.default_config, **row.overrides}, root="overrides")
    except ValidationFailed as exc:
        return str(exc.detail)
    return None
