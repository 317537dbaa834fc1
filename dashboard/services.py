"""Staff actions that are more than one call to an existing service. Everything else calls those directly
(suspend, resume and restart: ``provisioning.fleet.actions``, shared with the portal and the API)."""

from __future__ import annotations

from tenants.actors import Actor
from tenants.models import Tenant
from vault.choices import KeyPurpose
from vault.models import RotationJob
from vault.rotation import data_key_rotate_start

__all__ = ["tenant_keys_rotate"]


def tenant_keys_rotate(*, tenant: Tenant, actor: Actor) -> list[RotationJob]:
    """Rotate both of the tenant's data keys (credentials are re-encrypted; object keys get a new version)."""
    return [data_key_rotate_start(tenant=tenant, actor=actor, purpose=purpose)
            for purpose in (KeyPurpose.CREDENTIALS, KeyPurpose.OBJECTS)]
