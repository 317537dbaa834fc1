"""Runtime driver that records the instance but starts nothing: the instance boots later, on demand.

Selected with ``PROVISIONING_RUNTIME_DRIVER=deferred``. Used to pre-provision tenants in bulk
and by the onboarding benchmark, which measures the control plane's own work without the
cost of booting an instance process.
"""

from __future__ import annotations

import hashlib
import json

from .base import Observed, Ref, TenantSpec
from .protocols import Capability, RuntimeDriver

__all__ = ["DeferredRuntimeDriver"]


class DeferredRuntimeDriver(RuntimeDriver):
    name = "deferred"
    capabilities = frozenset({Capability.PUBLISH_BRANDING})
    release_artifact = ""  # it starts nothing: the profile's own runtime driver decides (registry)

    def ensure(self, spec: TenantSpec) -> Ref:
        return Ref(external_id=f"deferred:{spec.resource_name}", details={"deferred": True})

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        return Observed(exists=False, healthy=False, detail="instance start is deferred")

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        return None

    def publish_branding(self, spec: TenantSpec, theme: dict) -> str:
        """Nothing to write to yet: the hash is recorded, and the instance gets the theme when it boots."""
        return hashlib.sha256(json.dumps(theme, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
                              .encode()).hexdigest()
