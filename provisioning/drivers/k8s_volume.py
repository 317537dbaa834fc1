"""Volume driver for the kubernetes profile: the tenant's PersistentVolumeClaim ``agent-data``.

``ensure`` applies the tenant namespace (the same object the runtime driver applies) and the
claim; the runtime's StatefulSet mounts it at ``KUBERNETES_VOLUME_MOUNT_PATH``, which is what
``Ref.details["path"]`` (the instance's AGENT_VOLUME) says.
"""

from __future__ import annotations

from .base import Observed, Ref, TenantSpec
from .k8s_client import ObjectRef, cluster_config_from_settings, kube_from_settings
from .k8s_manifests import NAMES, namespace_name, namespace_object, pvc_object
from .protocols import Capability, VolumeDriver

__all__ = ["K8sVolumeDriver"]


class K8sVolumeDriver(VolumeDriver):
    name = "k8s-pvc"
    capabilities = frozenset[Capability]()

    def ensure(self, spec: TenantSpec) -> Ref:
        cfg = cluster_config_from_settings()
        ns = namespace_name(spec.resource_name, cfg.namespace_prefix)
        kube = kube_from_settings()
        kube.apply(namespace_object(namespace=ns, tenant_id=spec.tenant_id, operator_slug=spec.operator_slug))
        kube.apply(pvc_object(namespace=ns, tenant_id=spec.tenant_id, operator_slug=spec.operator_slug,
                              plan=cfg.plan(spec.plan), cfg=cfg))
        return Ref(
            external_id=f"k8s:{ns}/persistentvolumeclaim/{NAMES.pvc}",
            details={"path": cfg.mount_path, "namespace": ns, "claim": NAMES.pvc},
        )

    def _ref(self, spec: TenantSpec) -> ObjectRef:
        ns = namespace_name(spec.resource_name, cluster_config_from_settings().namespace_prefix)
        return ObjectRef("v1", "PersistentVolumeClaim", NAMES.pvc, ns)

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        target = self._ref(spec)
        pvc = kube_from_settings().get(target)
        if pvc is None:
            return Observed(exists=False, healthy=False, detail=f"{target} is missing")
        phase = (pvc.get("status") or {}).get("phase", "")
        if phase == "Lost":
            return Observed(exists=True, healthy=False, detail=f"{target} lost its volume")
        if pvc.get("metadata", {}).get("deletionTimestamp"):
            return Observed(exists=True, healthy=False, detail=f"{target} is being deleted")
        return Observed(exists=True, healthy=True, detail=phase)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        kube_from_settings().delete(self._ref(spec))
