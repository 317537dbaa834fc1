"""Runtime driver for the kubernetes profile: the tenant's namespace and its one-replica ``agent-host``.

``ensure`` server-side-applies every object from ``k8s_manifests.runtime_objects`` (so a
second call changes nothing and drift is taken back), then waits until the instance is
ready. Ready means: the StatefulSet reports ``readyReplicas >= 1`` for its current
generation and revision, i.e. the pod passed its ``/readyz`` probe (within
``KUBERNETES_READY_TIMEOUT_S``; on timeout the step fails and the workflow retries it).
``observe`` reads every object back from the API. ``delete`` deletes the namespace and
waits until the API no longer has it.

The tenant's release (``spec.release``) is a container image pinned by digest: the StatefulSet
runs it instead of the runtime's image, so a changed release changes the pod template and the
StatefulSet replaces the pod (``ensure`` waits for the new revision to be ready). A wheel
release is refused: a pod has no install directory of the control plane's to load it from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from controlplane.errors import ProvisioningError
from provisioning.resources.contributions import instance_theme
from tenants.models import Operator

from ..choices import ReleaseArtifact
from .base import Observed, Ref, TenantSpec
from .k8s_client import Kube, ObjectRef, cluster_config_from_settings, kube_from_settings
from .k8s_manifests import (
    NAMES,
    PSA_LEVEL,
    ReleaseImage,
    branding_config_map,
    namespace_name,
    runtime_objects,
    tenant_labels,
)
from .local_process import instance_environment
from .protocols import Capability, RuntimeDriver
from .s3_objectstore import vend_credentials

log = logging.getLogger(__name__)

__all__ = ["K8sRuntimeDriver", "instance_secret_data", "release_image"]

_S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CREDENTIAL_EXPIRATION")


def _theme_body(theme: dict[str, Any]) -> str:
    """Canonical JSON of a theme: the same bytes (and SHA-256) as the local driver's branding.json."""
    return json.dumps(theme, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _branding(operator_slug: str, theme: dict[str, Any] | None = None) -> dict[str, str]:
    op = Operator.objects.filter(slug=operator_slug).first()
    if op is None:
        return {}
    data = {
        "product_name": op.product_name or op.name,
        "logo_url": op.logo_url,
        "primary_color": op.primary_color,
        "background_color": op.background_color,
        "support_email": op.support_email,
    }
    if theme is None:
        theme = instance_theme(op)  # branding's (provisioning.resources.contributions)
    if theme is not None:
        body = _theme_body(theme)
        data["theme.json"] = body
        data["theme_sha256"] = hashlib.sha256(body.encode()).hexdigest()
    return data


def _secret_values(secret: Mapping[str, Any] | None) -> dict[str, str]:
    if not secret:
        return {}
    values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    values.update(secret.get("stringData") or {})  # servers that keep stringData as written
    return values


def _still_valid(values: Mapping[str, str]) -> bool:
    try:
        expires = datetime.fromisoformat(values["AWS_CREDENTIAL_EXPIRATION"])
    except (KeyError, ValueError):
        return False
    margin = timedelta(seconds=settings.S3_CREDENTIALS_RENEW_BEFORE_S)
    return all(values.get(k) for k in _S3_CREDENTIAL_KEYS) and expires - margin > datetime.now(UTC)


def instance_secret_data(spec: TenantSpec, current: Mapping[str, str]) -> dict[str, str]:
    """The instance's environment plus its object-store access; vended credentials are reused until near expiry."""
    data = instance_environment(spec)
    store = spec.resources["objectstore"].details
    data["AWS_REGION"] = str(store.get("region", ""))
    if store.get("endpoint_url"):
        data["AWS_ENDPOINT_URL_S3"] = str(store["endpoint_url"])
    if store.get("credentials") == "sts":
        if _still_valid(current):
            data.update({k: current[k] for k in _S3_CREDENTIAL_KEYS})
        else:
            data.update(vend_credentials(spec))
    return data


def release_image(spec: TenantSpec) -> ReleaseImage | None:
    """The image release the spec asks for; None: the runtime's image. ProvisioningError for what a pod cannot run."""
    if not spec.release:
        return None
    image, version, digest = (str(spec.release.get(k, "")) for k in ("image", "version", "digest"))
    if not image:
        raise ProvisioningError(f"release {version} ({digest}) is a wheel: Kubernetes instances run a container "
                                "image; register the release as an image pinned by digest")
    if not (version and digest.startswith("sha256:") and image.endswith("@" + digest)):
        raise ProvisioningError(f"the release given for the instance is incomplete (version {version!r}, digest "
                                f"{digest!r}, image {image!r}): it needs a version and an image pinned by its digest")
    return ReleaseImage(image=image, version=version, digest=digest)


def _statefulset_ready(sts: Mapping[str, Any] | None) -> tuple[bool, str]:
    if sts is None:
        return False, "StatefulSet agent-host is missing"
    status = sts.get("status") or {}
    generation = (sts.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return False, "StatefulSet update not yet observed by its controller"
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return False, f"rolling out revision {update}"
    ready = int(status.get("readyReplicas") or 0)
    if ready < 1:
        return False, "agent-host pod is not ready (/readyz)"
    return True, ""


class K8sRuntimeDriver(RuntimeDriver):
    name = "k8s-statefulset"
    # ROLLS_OUT_ITSELF: ensure() with another release patches the pod template and the StatefulSet replaces the
    # pod itself (SIGTERM, the grace period): a release switch must not delete the pod first (releases.assignments).
    # No PRESENT: "is a pod there" needs the API server, which is what observe() asks anyway.
    capabilities = frozenset({Capability.STOP, Capability.SLEEP, Capability.PUBLISH_BRANDING,
                              Capability.ROLLS_OUT_ITSELF})
    release_artifact = ReleaseArtifact.IMAGE

    def _namespace(self, spec: TenantSpec) -> str:
        return namespace_name(spec.resource_name, cluster_config_from_settings().namespace_prefix)

    def render(self, spec: TenantSpec, kube: Kube) -> list[dict[str, Any]]:
        cfg = cluster_config_from_settings()
        ns = namespace_name(spec.resource_name, cfg.namespace_prefix)
        current = _secret_values(kube.get(ObjectRef("v1", "Secret", NAMES.secret, ns)))
        return runtime_objects(
            namespace=ns, tenant_id=spec.tenant_id, operator_slug=spec.operator_slug, plan_name=spec.plan,
            cfg=cfg, secret_data=instance_secret_data(spec, current), branding=_branding(spec.operator_slug),
            release=release_image(spec),
        )

    def ensure(self, spec: TenantSpec) -> Ref:
        release = release_image(spec)  # refused before anything is applied
        kube = kube_from_settings()
        ns = self._namespace(spec)
        for obj in self.render(spec, kube):
            kube.apply(obj)
        self._wait_ready(kube, ns)
        return Ref(
            external_id=f"k8s:{ns}/statefulset/{NAMES.workload}",
            details={
                "namespace": ns,
                "workload": NAMES.workload,
                "endpoint": f"http://{NAMES.workload}-0.{NAMES.service}.{ns}.svc:{NAMES.http_port}",
                "release_version": release.version if release else "",
                "release_digest": release.digest if release else "",
            },
        )

    def _wait_ready(self, kube: Kube, ns: str) -> None:
        deadline = time.monotonic() + settings.KUBERNETES_READY_TIMEOUT_S
        target = ObjectRef("apps/v1", "StatefulSet", NAMES.workload, ns)
        while True:
            ok, why = _statefulset_ready(kube.get(target))
            if ok:
                return
            if time.monotonic() >= deadline:
                raise ProvisioningError(f"agent-host in namespace {ns} did not become ready in time: {why}")
            time.sleep(settings.KUBERNETES_READY_POLL_S)

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        kube = kube_from_settings()
        ns = self._namespace(spec)
        namespace = kube.get(ObjectRef("v1", "Namespace", ns))
        if namespace is None:
            return Observed(exists=False, healthy=False, detail=f"namespace {ns} is missing")
        problems: list[str] = []
        meta = namespace.get("metadata") or {}
        if meta.get("deletionTimestamp") or (namespace.get("status") or {}).get("phase") == "Terminating":
            problems.append(f"namespace {ns} is terminating")
        if (meta.get("labels") or {}).get("pod-security.kubernetes.io/enforce") != PSA_LEVEL:
            problems.append(f"namespace {ns} does not enforce Pod Security {PSA_LEVEL!r}")
        cfg = cluster_config_from_settings()
        expected = runtime_objects(namespace=ns, tenant_id=spec.tenant_id, operator_slug=spec.operator_slug,
                                   plan_name=spec.plan, cfg=cfg, secret_data={}, branding={})
        found: dict[str, dict[str, Any]] = {}
        for obj in expected[1:]:
            target = ObjectRef.of(obj)
            live = kube.get(target)
            if live is None:
                problems.append(f"{target} is missing")
            else:
                found[obj["kind"]] = live
        sa = found.get("ServiceAccount")
        if sa is not None and sa.get("automountServiceAccountToken") is not False:
            problems.append("ServiceAccount agent-host would mount an API token")
        sts = found.get("StatefulSet")
        if sts is not None:
            if (sts.get("spec") or {}).get("replicas") != 1:
                problems.append(f"StatefulSet agent-host has replicas={sts['spec'].get('replicas')}, expected 1")
            ok, why = _statefulset_ready(sts)
            if not ok:
                problems.append(why)
        return Observed(exists=sts is not None, healthy=not problems, detail="; ".join(problems))

    def publish_branding(self, spec: TenantSpec, theme: dict[str, Any]) -> str:
        """Roll a theme out to the tenant's branding ConfigMap (mounted read-only in the pod)."""
        kube = kube_from_settings()
        ns = self._namespace(spec)
        data = _branding(spec.operator_slug, theme)
        kube.apply(branding_config_map(namespace=ns, labels=tenant_labels(spec.tenant_id, spec.operator_slug),
                                       branding=data))
        return data["theme_sha256"]

    def stop(self, spec: TenantSpec, *, grace_s: float) -> bool | None:
        """Recovery's "stop what is left": delete the pod (SIGTERM, then SIGKILL after the pod's grace
        period); the StatefulSet brings a fresh one, which ``ensure`` then waits for. Volume, Secret and
        namespace stay. Returns None: whether the old pod flushed cleanly is for the runtime to record.

        Returns once the old pod is gone or replaced (another uid), or its grace period has run out: an ``ensure``
        right after a delete that returned at once could read the StatefulSet's stale "ready" and mark the
        instance running while the old pod was still shutting down, and the pod watcher would then take that
        pod's end for a death nobody planned.
        """
        kube = kube_from_settings()
        pod = ObjectRef("v1", "Pod", f"{NAMES.workload}-0", self._namespace(spec))
        old = kube.get(pod)
        kube.delete(pod)  # also when it was not found: one may have been created since
        if old is not None:
            self._wait_pod_gone(kube, pod, old, grace_s=grace_s)
        return None

    def sleep(self, spec: TenantSpec, *, grace_s: float) -> bool | None:
        """Scale to zero: the StatefulSet's replicas to 0, so its controller stops the pod (SIGTERM, the pod's
        grace period) and makes no new one; volume, Secret and namespace stay. The wake is a plain ``ensure``:
        its apply sets replicas back to 1 and waits for the new pod to be ready.

        Returns once the pod is gone and the StatefulSet reports no ready replica (or the grace has run out):
        a wake right after could otherwise read the stale "ready" of the pod that is still going away.
        """
        kube = kube_from_settings()
        ns = self._namespace(spec)
        pod = ObjectRef("v1", "Pod", f"{NAMES.workload}-0", ns)
        target = ObjectRef("apps/v1", "StatefulSet", NAMES.workload, ns)
        old = kube.get(pod)
        kube.patch(target, {"spec": {"replicas": 0}})
        if old is not None:
            self._wait_pod_gone(kube, pod, old, grace_s=grace_s, replaced_counts=False)
        deadline = time.monotonic() + max(grace_s, 5.0)
        while int(((kube.get(target) or {}).get("status") or {}).get("readyReplicas") or 0) > 0:
            if time.monotonic() >= deadline:
                log.warning("the StatefulSet still reports a ready replica after scaling to zero",
                            extra={"event": "k8s_sleep_slow", "namespace": ns})
                break
            time.sleep(settings.KUBERNETES_READY_POLL_S)
        return None

    def _wait_pod_gone(self, kube: Kube, pod: ObjectRef, old: Mapping[str, Any], *, grace_s: float,
                       replaced_counts: bool = True) -> None:
        """Wait until ``old`` is gone (or, with ``replaced_counts``, replaced by a pod of another uid), at most
        its grace period plus 5 s."""
        uid = (old.get("metadata") or {}).get("uid")
        pod_grace = float((old.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        deadline = time.monotonic() + max(grace_s, pod_grace) + 5
        while time.monotonic() < deadline:
            current = kube.get(pod)
            if current is None or (replaced_counts and (current.get("metadata") or {}).get("uid") != uid):
                return
            time.sleep(settings.KUBERNETES_READY_POLL_S)
        log.warning("the stopped pod outlived its grace period", extra={"event": "k8s_pod_stop_slow",
                                                                         "namespace": pod.namespace})

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        kube = kube_from_settings()
        ns = self._namespace(spec)
        target = ObjectRef("v1", "Namespace", ns)
        kube.delete(target)
        deadline = time.monotonic() + settings.KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S
        while kube.get(target) is not None:
            if time.monotonic() >= deadline:
                raise ProvisioningError(f"namespace {ns} is still terminating")
            time.sleep(settings.KUBERNETES_READY_POLL_S)
