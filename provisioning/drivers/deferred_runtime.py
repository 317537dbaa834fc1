"""Runtime driver that records the instance but starts nothing: the instance boots later, on demand.

Selected with ``PROVISIONING_RUNTIME_DRIVER=deferred``. Used to pre-provision tenants in bulk
and by the onboarding benchmark, which measures the control plane's own work without the
cost of booting an instance process.
"""

from __future__ import annotations

from .base import Observed, Ref, TenantSpec

__all__ = ["DeferredRuntimeDriver"]


class DeferredRuntimeDriver:
    name = "deferred"

    def ensure(self, spec: TenantSpec) -> Ref:
        return Ref(external_id=f"deferred:{spec.resource_name}", details={"deferred": True})

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        return Observed(exists=False, healthy=False, detail="instance start is deferred")

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        return None
