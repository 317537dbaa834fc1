"""A small typed layer over the official ``kubernetes`` client: get, apply, delete any object by its dict.

``apply`` is server-side apply (``application/apply-patch+yaml`` with our field manager and
``force``): re-applying the same object changes nothing, and fields someone changed behind
our back are taken back. Some API peers (test emulators, very old servers) answer 404 to an
apply of a missing object instead of creating it; then the object is created with POST, so
the driver behaves the same against both. No Django models here; settings only in
``cluster_config_from_settings`` and ``api_client_from_settings``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from .k8s_manifests import ClusterConfig, K8sObject, egress_target, plans_from_mapping

__all__ = ["Kube", "KubeError", "KubeNotFound", "api_client_from_settings", "cluster_config_from_settings"]

# (apiVersion, kind) -> (plural, namespaced). Only what the drivers manage.
_RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("v1", "ResourceQuota"): ("resourcequotas", True),
    ("v1", "LimitRange"): ("limitranges", True),
    ("v1", "Service"): ("services", True),
    ("v1", "Pod"): ("pods", True),  # only deleted: stop / restart / rolling restart (the StatefulSet makes a new one)
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networkpolicies", True),
    ("apps/v1", "StatefulSet"): ("statefulsets", True),
}


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


class KubeNotFound(KubeError):
    pass


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: K8sObject) -> ObjectRef:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def collection_path(self) -> str:
        plural, namespaced = _RESOURCES[(self.api_version, self.kind)]
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if namespaced:
            if not self.namespace:
                raise ValueError(f"{self.kind} {self.name} needs a namespace")
            return f"{base}/namespaces/{self.namespace}/{plural}"
        return f"{base}/{plural}"

    def path(self) -> str:
        return f"{self.collection_path()}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


class Kube:
    """The API calls the drivers make, over one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: k8s.ApiClient, *, field_manager: str, timeout_s: float = 30.0) -> None:
        self.api = api_client
        self.field_manager = field_manager
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
              body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        _method, url, headers, body, _post = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(method, url, header_params=headers, body=body,
                                         _request_timeout=self.timeout_s)
        except ApiException as exc:  # transport-level failures surface as ApiException too
            raise KubeError(exc.status or 0, str(exc.reason)) from None
        raw = response.read() or b"{}"
        if response.status == 404:
            raise KubeNotFound(404, f"{method} {path}")
        if response.status >= 400:
            try:
                message = json.loads(raw).get("message", "")
            except ValueError:
                message = raw[:300].decode(errors="replace")
            raise KubeError(response.status, f"{method} {path}: {message}")
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return self._call("GET", ref.path())
        except KubeNotFound:
            return None

    def apply(self, obj: K8sObject) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        query = [("fieldManager", self.field_manager), ("force", "true")]
        try:
            return self._call("PATCH", ref.path(), query=query, body=obj,
                              content_type="application/apply-patch+yaml")
        except KubeNotFound:
            pass
        try:
            return self._call("POST", ref.collection_path(), query=[("fieldManager", self.field_manager)], body=obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        # Created by someone else between our two calls: apply onto it.
        return self._call("PATCH", ref.path(), query=query, body=obj, content_type="application/apply-patch+yaml")

    def patch(self, ref: ObjectRef, body: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (RFC 7386) of one object: a change that is not ours to own, such as scaling a
        StatefulSet to zero; the next ``apply`` (with ``force``) takes the field back."""
        return self._call("PATCH", ref.path(), body=body, content_type="application/merge-patch+json")

    def delete(self, ref: ObjectRef) -> bool:
        """Delete (background propagation). False if it was already gone."""
        try:
            self._call("DELETE", ref.path(), body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                   "propagationPolicy": "Background"})
        except KubeNotFound:
            return False
        return True


def api_client_from_settings() -> k8s.ApiClient:
    if settings.KUBERNETES_IN_CLUSTER:
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)
        return k8s.ApiClient(cfg)
    return k8s_config.new_client_from_config(
        config_file=settings.KUBERNETES_KUBECONFIG or None, context=settings.KUBERNETES_CONTEXT
    )


def kube_from_settings() -> Kube:
    return Kube(api_client_from_settings(), field_manager=settings.KUBERNETES_FIELD_MANAGER,
                timeout_s=settings.KUBERNETES_REQUEST_TIMEOUT_S)


def cluster_config_from_settings() -> ClusterConfig:
    s = settings
    return ClusterConfig(
        namespace_prefix=s.KUBERNETES_NAMESPACE_PREFIX,
        image=s.KUBERNETES_AGENT_IMAGE,
        image_pull_policy=s.KUBERNETES_IMAGE_PULL_POLICY,
        image_pull_secret=s.KUBERNETES_IMAGE_PULL_SECRET,
        plans=plans_from_mapping(s.KUBERNETES_PLANS),
        storage_class=s.KUBERNETES_STORAGE_CLASS,
        volume_access_mode=s.KUBERNETES_VOLUME_ACCESS_MODE,
        mount_path=s.KUBERNETES_VOLUME_MOUNT_PATH,
        uid=s.KUBERNETES_AGENT_UID,
        grace_period_s=s.KUBERNETES_AGENT_GRACE_PERIOD_S,
        flush_margin_s=s.KUBERNETES_FLUSH_MARGIN_S,
        control_plane=egress_target(
            ports=[s.KUBERNETES_CONTROL_PLANE_PORT], namespace=s.KUBERNETES_CONTROL_PLANE_NAMESPACE,
            pod_labels=s.KUBERNETES_CONTROL_PLANE_POD_LABELS,
        ),
        dns=egress_target(ports=[53], namespace=s.KUBERNETES_DNS_NAMESPACE, pod_labels=s.KUBERNETES_DNS_POD_LABELS,
                          protocols=("UDP", "TCP")),
        postgres=egress_target(ports=[s.KUBERNETES_POSTGRES_PORT], cidrs=s.KUBERNETES_POSTGRES_CIDRS,
                               namespace=s.KUBERNETES_POSTGRES_NAMESPACE),
        objectstore=egress_target(ports=s.KUBERNETES_OBJECTSTORE_PORTS, cidrs=s.KUBERNETES_OBJECTSTORE_CIDRS,
                                  namespace=s.KUBERNETES_OBJECTSTORE_NAMESPACE),
    )
