"""Kubernetes objects of one tenant, rendered as plain dicts. No I/O and no Django here.

Everything a tenant's instance runs with lives in its own namespace: Pod Security
``restricted`` (enforce, warn, audit), ResourceQuota and LimitRange from the plan,
default-deny NetworkPolicy with explicit egress allows, a ServiceAccount without a
token, the instance Secret, the branding ConfigMap, the PersistentVolumeClaim, a
headless Service and a one-replica StatefulSet running ``agent-host``: from the runtime's
image, or from the image of the operator's release the tenant is assigned (``ReleaseImage``).

Every name inside the namespace is a constant: isolation comes from the namespace,
and a workload only ever references objects of its own namespace by those constants.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "tenant_labels",
    "ClusterConfig",
    "EgressTarget",
    "K8sObject",
    "LABEL_MANAGED_BY",
    "LABEL_OPERATOR",
    "LABEL_TENANT",
    "NAMES",
    "PlanResources",
    "ReleaseImage",
    "branding_config_map",
    "namespace_name",
    "namespace_object",
    "pvc_object",
    "runtime_objects",
    "secret_revision",
]

K8sObject = dict[str, Any]

MANAGER = "agent-control-plane"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TENANT = "agents.controlplane.io/tenant-id"
LABEL_OPERATOR = "agents.controlplane.io/operator"
ANNOTATION_SECRET_REVISION = "agents.controlplane.io/secret-revision"
PSA_LEVEL = "restricted"
_TMP = "/tmp"  # noqa: S108 - the pod's own emptyDir: the root filesystem is read-only


@dataclass(frozen=True)
class _Names:
    service_account: str = "agent-host"
    secret: str = "agent-instance-env"
    branding: str = "agent-branding"
    pvc: str = "agent-data"
    workload: str = "agent-host"
    service: str = "agent-host"
    quota: str = "tenant-quota"
    limits: str = "tenant-limits"
    deny_all: str = "default-deny"
    allow_egress: str = "allow-egress"
    allow_ingress: str = "allow-ingress-from-control-plane"
    container: str = "agent-host"
    http_port: int = 8080


NAMES = _Names()


@dataclass(frozen=True)
class PlanResources:
    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str
    storage: str
    pids: str = "512"  # the local profile's pids limit (local_limits); a pod's is the kubelet's, per node


@dataclass(frozen=True)
class EgressTarget:
    """Where instances may connect: IP blocks and/or every pod of one namespace, on these ports."""

    ports: tuple[int, ...]
    cidrs: tuple[str, ...] = ()
    namespace: str = ""
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    protocols: tuple[str, ...] = ("TCP",)


@dataclass(frozen=True)
class ClusterConfig:
    namespace_prefix: str
    image: str
    plans: Mapping[str, PlanResources]
    control_plane: EgressTarget
    dns: EgressTarget
    postgres: EgressTarget
    objectstore: EgressTarget
    image_pull_policy: str = "IfNotPresent"
    image_pull_secret: str = ""
    storage_class: str = ""
    volume_access_mode: str = "ReadWriteOnce"
    mount_path: str = "/data"
    uid: int = 10001
    grace_period_s: int = 45
    flush_margin_s: int = 15

    def plan(self, name: str) -> PlanResources:
        try:
            return self.plans[name]
        except KeyError:
            raise ValueError(f"no Kubernetes resources are configured for plan {name!r}") from None


@dataclass(frozen=True)
class ReleaseImage:
    """An operator's release, run as the pod's image instead of ``ClusterConfig.image``. ``version`` and
    ``digest`` go to the host's environment, so its boot record names the release it runs."""

    image: str  # <registry>/<repository>@sha256:<hex>
    version: str
    digest: str  # sha256:<hex>, the one in ``image``


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def namespace_name(resource_name: str, prefix: str) -> str:
    """The tenant's namespace: a DNS-1123 label from its (id-derived) resource name, e.g. ``tenant-t-<hex>``."""
    name = (prefix + resource_name).lower().replace("_", "-")
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(f"{name!r} is not a valid namespace name (DNS-1123 label, at most 63 characters)")
    return name


def tenant_labels(tenant_id: str, operator_slug: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGER, LABEL_TENANT: tenant_id, LABEL_OPERATOR: operator_slug}


def _meta(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def namespace_object(*, namespace: str, tenant_id: str, operator_slug: str) -> K8sObject:
    labels = tenant_labels(tenant_id, operator_slug)
    for mode in ("enforce", "warn", "audit"):
        labels[f"pod-security.kubernetes.io/{mode}"] = PSA_LEVEL
        labels[f"pod-security.kubernetes.io/{mode}-version"] = "latest"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}


def pvc_object(*, namespace: str, tenant_id: str, operator_slug: str, plan: PlanResources,
               cfg: ClusterConfig) -> K8sObject:
    spec: dict[str, Any] = {
        "accessModes": [cfg.volume_access_mode],
        "resources": {"requests": {"storage": plan.storage}},
        "volumeMode": "Filesystem",
    }
    if cfg.storage_class:
        spec["storageClassName"] = cfg.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(NAMES.pvc, namespace, tenant_labels(tenant_id, operator_slug)),
        "spec": spec,
    }


def branding_config_map(*, namespace: str, labels: Mapping[str, str], branding: Mapping[str, str]) -> K8sObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(NAMES.branding, namespace, labels),
        "data": {k: str(v) for k, v in sorted(branding.items())},
    }


def secret_revision(data: Mapping[str, str]) -> str:
    """A digest of the Secret's content: on the pod template, a changed Secret restarts the pod."""
    return hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()[:16]


def _peers(target: EgressTarget) -> list[dict[str, Any]]:
    peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": cidr}} for cidr in target.cidrs]
    if target.namespace:
        peer: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": target.namespace}}
        }
        if target.pod_labels:
            peer["podSelector"] = {"matchLabels": dict(target.pod_labels)}
        peers.append(peer)
    return peers


def _egress_rule(target: EgressTarget) -> dict[str, Any] | None:
    peers = _peers(target)
    if not peers:
        return None  # nothing configured: no allow at all (never "to anywhere")
    ports = [{"protocol": proto, "port": port} for port in target.ports for proto in target.protocols]
    return {"to": peers, "ports": ports}


def _network_policies(namespace: str, labels: Mapping[str, str], cfg: ClusterConfig) -> list[K8sObject]:
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(NAMES.deny_all, namespace, labels),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }
    rules = [r for t in (cfg.dns, cfg.control_plane, cfg.postgres, cfg.objectstore) if (r := _egress_rule(t))]
    egress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(NAMES.allow_egress, namespace, labels),
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": rules},
    }
    ingress_peers = _peers(EgressTarget(ports=(), namespace=cfg.control_plane.namespace,
                                        pod_labels=cfg.control_plane.pod_labels))
    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(NAMES.allow_ingress, namespace, labels),
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": NAMES.workload}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": ingress_peers, "ports": [{"protocol": "TCP", "port": NAMES.http_port}]}]
            if ingress_peers else [],
        },
    }
    return [deny, egress, ingress]


def _quota_and_limits(namespace: str, labels: Mapping[str, str], plan: PlanResources) -> list[K8sObject]:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(NAMES.quota, namespace, labels),
        "spec": {
            "hard": {
                "requests.cpu": plan.cpu_request,
                "limits.cpu": plan.cpu_limit,
                "requests.memory": plan.memory_request,
                "limits.memory": plan.memory_limit,
                "requests.storage": plan.storage,
                "persistentvolumeclaims": "1",
                "pods": "2",
                "services": "1",
                "services.loadbalancers": "0",
                "services.nodeports": "0",
                "secrets": "4",
                "configmaps": "4",
            }
        },
    }
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta(NAMES.limits, namespace, labels),
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": {"cpu": plan.cpu_limit, "memory": plan.memory_limit},
                    "defaultRequest": {"cpu": plan.cpu_request, "memory": plan.memory_request},
                    "max": {"cpu": plan.cpu_limit, "memory": plan.memory_limit},
                },
                {"type": "PersistentVolumeClaim", "max": {"storage": plan.storage}},
            ]
        },
    }
    return [quota, limits]


def _container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _release_env(release: ReleaseImage | None) -> list[dict[str, str]]:
    if release is None:
        return []
    # Not in the Secret: a new release must change the pod template (the image alone would too; this says why).
    return [{"name": "AGENT_RELEASE_VERSION", "value": release.version},
            {"name": "AGENT_RELEASE_DIGEST", "value": release.digest}]


def _workload(namespace: str, labels: Mapping[str, str], plan: PlanResources, cfg: ClusterConfig,
              revision: str, release: ReleaseImage | None) -> list[K8sObject]:
    selector = {"app.kubernetes.io/name": NAMES.workload, LABEL_TENANT: labels[LABEL_TENANT]}
    pod_labels = {**labels, **selector}
    probe_port = "http"
    container = {
        "name": NAMES.container,
        "image": release.image if release is not None else cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["agent-host"],
        "envFrom": [{"secretRef": {"name": NAMES.secret}}],
        "env": [
            {"name": "AGENT_HTTP_HOST", "value": "0.0.0.0"},  # noqa: S104 - inside the pod's own netns
            {"name": "AGENT_HTTP_PORT", "value": str(NAMES.http_port)},
            {"name": "AGENT_GRACE_PERIOD_S", "value": str(cfg.grace_period_s)},
            {"name": "AGENT_BRANDING_DIR", "value": "/etc/agent/branding"},
            {"name": "HOME", "value": _TMP},
            {"name": "TMPDIR", "value": _TMP},
            *_release_env(release),
        ],
        "ports": [{"name": "http", "containerPort": NAMES.http_port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": plan.cpu_request, "memory": plan.memory_request},
            "limits": {"cpu": plan.cpu_limit, "memory": plan.memory_limit},
        },
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": probe_port},
            "periodSeconds": 5, "failureThreshold": 60, "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": probe_port},
            "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": probe_port},
            "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 3,
        },
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "data", "mountPath": cfg.mount_path},
            {"name": "tmp", "mountPath": _TMP},
            {"name": "branding", "mountPath": "/etc/agent/branding", "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": NAMES.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": cfg.grace_period_s + cfg.flush_margin_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": cfg.uid,
            "runAsGroup": cfg.uid,
            "fsGroup": cfg.uid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": NAMES.pvc}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {"name": "branding", "configMap": {"name": NAMES.branding}},
        ],
    }
    if cfg.image_pull_secret:
        pod_spec["imagePullSecrets"] = [{"name": cfg.image_pull_secret}]
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(NAMES.workload, namespace, labels),
        "spec": {
            # One replica, and a StatefulSet never starts a pod's replacement before the old one is
            # gone: the runtime never has two writers on the tenant's schema and volume.
            "replicas": 1,
            "serviceName": NAMES.service,
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {ANNOTATION_SECRET_REVISION: revision}},
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(NAMES.service, namespace, labels),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": NAMES.http_port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [service, statefulset]


def runtime_objects(*, namespace: str, tenant_id: str, operator_slug: str, plan_name: str, cfg: ClusterConfig,
                    secret_data: Mapping[str, str], branding: Mapping[str, str],
                    release: ReleaseImage | None = None) -> list[K8sObject]:
    """Every object of the tenant's instance (PVC excluded: the volume driver owns it), in apply order.

    ``release``: the operator's release the pod runs; None: the runtime's image and its installed agents."""
    plan = cfg.plan(plan_name)
    labels = tenant_labels(tenant_id, operator_slug)
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(NAMES.service_account, namespace, labels),
        "automountServiceAccountToken": False,
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(NAMES.secret, namespace, labels),
        "type": "Opaque",
        "stringData": dict(sorted(secret_data.items())),
    }
    return [
        namespace_object(namespace=namespace, tenant_id=tenant_id, operator_slug=operator_slug),
        *_quota_and_limits(namespace, labels, plan),
        *_network_policies(namespace, labels, cfg),
        service_account,
        secret,
        branding_config_map(namespace=namespace, labels=labels, branding=branding),
        *_workload(namespace, labels, plan, cfg, secret_revision(secret_data), release),
    ]


def plans_from_mapping(plans: Mapping[str, Mapping[str, str]]) -> dict[str, PlanResources]:
    return {name: PlanResources(**values) for name, values in plans.items()}


def egress_target(*, ports: Sequence[int], cidrs: Sequence[str] = (), namespace: str = "",
                  pod_labels: Mapping[str, str] | None = None, protocols: Sequence[str] = ("TCP",)) -> EgressTarget:
    return EgressTarget(ports=tuple(ports), cidrs=tuple(cidrs), namespace=namespace,
                        pod_labels=dict(pod_labels or {}), protocols=tuple(protocols))
