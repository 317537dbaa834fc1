"""Kubernetes runtime and volume drivers against kmock's API emulator, over HTTP through a kubeconfig.

Provision, re-apply (nothing changes, nothing is created), drift (objects deleted or edited
behind the driver's back are reported by ``observe`` and repaired by ``ensure``), readiness
timeout, and deprovision (the namespace and everything in it are gone when ``delete`` returns).
"""

from __future__ import annotations

import base64
import os
import uuid

import pytest

from controlplane.errors import ProvisioningError
from provisioning.drivers.base import Ref, TenantId, TenantSpec
from provisioning.drivers.k8s_runtime import K8sRuntimeDriver
from provisioning.drivers.k8s_volume import K8sVolumeDriver
from tests.k8s_fixtures import run_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(tmp_path, settings):
    settings.TENANT_DATABASE_URL = "postgresql://cp_admin@db.internal:5432/tenants"  # rendered, never dialled
    yield from run_cluster(tmp_path, settings)


def make_spec(operator, *, plan: str = "standard") -> TenantSpec:
    tenant_id = str(uuid.uuid4())
    resource_name = f"t_{uuid.UUID(tenant_id).hex}"
    return TenantSpec(
        tenant_id=TenantId(tenant_id),
        resource_name=resource_name,
        operator_slug=operator.slug,
        plan=plan,
        resources={
            "database": Ref(resource_name, {"schema": resource_name, "role": resource_name}),
            "volume": Ref("k8s:x/persistentvolumeclaim/agent-data", {"path": "/data"}),
            "objectstore": Ref(f"s3://bucket/tenants/{tenant_id}/", {
                "url": f"s3://bucket/tenants/{tenant_id}/", "region": "eu-west-1",
                "endpoint_url": "http://minio.storage.svc:9000", "credentials": "none",
            }),
        },
        secrets={
            "db_password": "pw-" + uuid.uuid4().hex,
            "object_key_b64": base64.b64encode(os.urandom(32)).decode(),
            "instance_token": "tok-" + uuid.uuid4().hex,
        },
    )


def provision(spec: TenantSpec) -> tuple[Ref, Ref]:
    return K8sVolumeDriver().ensure(spec), K8sRuntimeDriver().ensure(spec)


def without_status(objects: dict) -> dict:
    return {key: {k: v for k, v in obj.items() if k != "status"} for key, obj in objects.items()}


def test_provision_creates_the_tenant_namespace_and_instance(cluster, operator):
    spec = make_spec(operator)
    volume_ref, runtime_ref = provision(spec)
    ns = runtime_ref.details["namespace"]
    assert ns == "tenant-t-" + uuid.UUID(spec.tenant_id).hex
    assert volume_ref.details == {"path": "/data", "namespace": ns, "claim": "agent-data"}
    assert runtime_ref.details["endpoint"] == f"http://agent-host-0.agent-host.{ns}.svc:8080"

    objects = cluster.objects(ns)
    assert set(objects) == {
        ("namespaces", ns), ("resourcequotas", "tenant-quota"), ("limitranges", "tenant-limits"),
        ("networkpolicies", "default-deny"), ("networkpolicies", "allow-egress"),
        ("networkpolicies", "allow-ingress-from-control-plane"), ("serviceaccounts", "agent-host"),
        ("secrets", "agent-instance-env"), ("configmaps", "agent-branding"),
        ("persistentvolumeclaims", "agent-data"), ("services", "agent-host"), ("statefulsets", "agent-host"),
    }
    labels = objects[("namespaces", ns)]["metadata"]["labels"]
    assert labels["agents.controlplane.io/tenant-id"] == spec.tenant_id
    assert labels["agents.controlplane.io/operator"] == operator.slug
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"

    env = objects[("secrets", "agent-instance-env")]["stringData"]
    assert env["AGENT_TENANT_ID"] == spec.tenant_id
    assert env["AGENT_VOLUME"] == "/data"
    assert env["AGENT_OBJECTSTORE_URL"] == f"s3://bucket/tenants/{spec.tenant_id}/"
    assert env["AGENT_OBJECT_KEY"] == spec.secrets["object_key_b64"]
    assert env["AGENT_INSTANCE_TOKEN"] == spec.secrets["instance_token"]
    assert spec.secrets["db_password"] in env["AGENT_DATABASE_URL"]
    assert env["AWS_ENDPOINT_URL_S3"] == "http://minio.storage.svc:9000"
    assert "AWS_SECRET_ACCESS_KEY" not in env  # no role ARN configured: nothing vended

    branding = objects[("configmaps", "agent-branding")]["data"]
    assert branding["product_name"] == operator.product_name
    assert branding["primary_color"] == operator.primary_color

    observed = K8sRuntimeDriver().observe(spec, runtime_ref)
    assert (observed.exists, observed.healthy) == (True, True), observed.detail
    assert K8sVolumeDriver().observe(spec, volume_ref).healthy


def test_reapply_changes_nothing(cluster, operator):
    spec = make_spec(operator)
    provision(spec)
    ns = K8sRuntimeDriver()._namespace(spec)
    before = without_status(cluster.objects(ns))
    posts = cluster.request_count("POST")

    provision(spec)
    provision(spec)

    assert without_status(cluster.objects(ns)) == before
    assert cluster.request_count("POST") == posts  # re-apply patched in place, created nothing


def test_object_deleted_behind_our_back_is_reported_and_comes_back(cluster, operator):
    spec = make_spec(operator)
    _volume_ref, ref = provision(spec)
    ns = ref.details["namespace"]
    driver = K8sRuntimeDriver()
    pristine = without_status(cluster.objects(ns))

    cluster.http("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/default-deny")
    cluster.http("DELETE", f"/api/v1/namespaces/{ns}/secrets/agent-instance-env")
    observed = driver.observe(spec, ref)
    assert not observed.healthy
    assert "NetworkPolicy" in observed.detail and "default-deny" in observed.detail
    assert "Secret" in observed.detail

    driver.ensure(spec)
    assert driver.observe(spec, ref).healthy
    assert without_status(cluster.objects(ns)) == pristine


def test_edited_fields_are_reported_and_taken_back(cluster, operator):
    spec = make_spec(operator)
    _volume_ref, ref = provision(spec)
    ns = ref.details["namespace"]
    driver = K8sRuntimeDriver()
    cluster.kubelet.enabled.clear()  # keep the status as the "controller" left it

    cluster.http("PATCH", f"/apis/apps/v1/namespaces/{ns}/statefulsets/agent-host", {"spec": {"replicas": 2}},
                 content_type="application/merge-patch+json")
    cluster.http("PATCH", f"/api/v1/namespaces/{ns}",
                 {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
                 content_type="application/merge-patch+json")
    cluster.http("PATCH", f"/api/v1/namespaces/{ns}/serviceaccounts/agent-host",
                 {"automountServiceAccountToken": True}, content_type="application/merge-patch+json")
    detail = driver.observe(spec, ref).detail
    assert "replicas=2" in detail
    assert "Pod Security" in detail
    assert "API token" in detail

    driver.ensure(spec)
    objects = cluster.objects(ns)
    assert objects[("statefulsets", "agent-host")]["spec"]["replicas"] == 1
    assert objects[("namespaces", ns)]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert objects[("serviceaccounts", "agent-host")]["automountServiceAccountToken"] is False
    assert driver.observe(spec, ref).healthy


def test_volume_claim_deleted_behind_our_back_comes_back(cluster, operator):
    spec = make_spec(operator)
    volume_ref, _ = provision(spec)
    ns = volume_ref.details["namespace"]
    volume = K8sVolumeDriver()

    cluster.http("DELETE", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/agent-data")
    observed = volume.observe(spec, volume_ref)
    assert (observed.exists, observed.healthy) == (False, False)

    volume.ensure(spec)
    assert volume.observe(spec, volume_ref).exists
    assert cluster.objects(ns)[("persistentvolumeclaims", "agent-data")]["spec"]["resources"] == {
        "requests": {"storage": "5Gi"}
    }


def test_instance_that_never_becomes_ready_fails_the_step(cluster, operator, settings):
    settings.KUBERNETES_READY_TIMEOUT_S = 0.5
    cluster.kubelet.enabled.clear()
    spec = make_spec(operator)
    K8sVolumeDriver().ensure(spec)
    with pytest.raises(ProvisioningError, match="did not become ready"):
        K8sRuntimeDriver().ensure(spec)
    observed = K8sRuntimeDriver().observe(spec, Ref("x"))
    assert observed.exists and not observed.healthy
    assert "not ready" in observed.detail

    cluster.kubelet.enabled.set()  # the pod comes up: the retried step succeeds
    settings.KUBERNETES_READY_TIMEOUT_S = 5.0
    K8sRuntimeDriver().ensure(spec)
    assert K8sRuntimeDriver().observe(spec, Ref("x")).healthy


def test_deprovision_removes_the_namespace_and_waits_for_it(cluster, operator):
    spec = make_spec(operator)
    other = make_spec(operator)
    volume_ref, ref = provision(spec)
    provision(other)
    ns = ref.details["namespace"]
    driver = K8sRuntimeDriver()

    driver.delete(spec, ref)

    # delete() returned only once the namespace was finalized, with everything in it.
    assert cluster.http("GET", f"/api/v1/namespaces/{ns}") is None
    assert cluster.objects(ns) == {}
    observed = driver.observe(spec, ref)
    assert (observed.exists, observed.healthy) == (False, False)
    driver.delete(spec, ref)  # already gone: not an error
    K8sVolumeDriver().delete(spec, volume_ref)
    # The other tenant is untouched.
    assert driver.observe(other, ref).healthy


def test_publish_branding_rolls_the_theme_into_the_config_map_and_survives_reapply(cluster, operator):
    import hashlib
    import json

    spec = make_spec(operator)
    _, runtime_ref = provision(spec)
    ns = runtime_ref.details["namespace"]
    theme = {"product_name": "Acme Agent", "colors": {"primary": "#1f4b99", "background": "#ffffff"}}
    digest = K8sRuntimeDriver().publish_branding(spec, theme)
    body = json.dumps(theme, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert digest == hashlib.sha256(body.encode()).hexdigest()
    data = cluster.objects(ns)[("configmaps", "agent-branding")]["data"]
    assert data["theme.json"] == body and data["theme_sha256"] == digest
    assert data["product_name"] == (operator.product_name or operator.name)


def _pod(cluster, ns: str) -> dict | None:  # type: ignore[no-untyped-def]
    return cluster.http("GET", f"/api/v1/namespaces/{ns}/pods/agent-host-0")


def test_stop_deletes_the_tenants_pod_and_only_it(cluster, operator):
    """Recovery, restart and rolling restart stop an instance by deleting its pod (the StatefulSet brings a
    fresh one). The client had no Pod mapping: a KeyError, so all three were broken in this profile."""
    spec, other = make_spec(operator), make_spec(operator)
    refs = {id(s): provision(s)[1] for s in (spec, other)}
    for s in (spec, other):
        ns = refs[id(s)].details["namespace"]
        cluster.http("POST", f"/api/v1/namespaces/{ns}/pods",
                     {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-host-0", "namespace": ns},
                      "spec": {"containers": [{"name": "agent-host", "image": "x"}]}})
        assert _pod(cluster, ns) is not None
    assert K8sRuntimeDriver().stop(spec, grace_s=1) is None
    assert _pod(cluster, refs[id(spec)].details["namespace"]) is None
    assert _pod(cluster, refs[id(other)].details["namespace"]) is not None
    K8sRuntimeDriver().stop(spec, grace_s=1)  # already gone: not an error


_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def _resource_of(path: str) -> tuple[str, str]:
    """(api group, plural) of a request path: /api/v1/namespaces/<ns>/<plural>/<name> or /apis/<g>/<v>/..."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "namespaces" and len(rest) > 2:
        return group, rest[2]
    return group, rest[0]


def test_the_control_planes_rbac_allows_every_call_its_client_makes(cluster, operator):
    """Provision, re-apply, stop, publish branding, deprovision: every (verb, resource) the client used is
    granted by deploy/kubernetes/10-rbac.yaml and covered by the admission policy, and nothing is listed."""
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    role = next(d for d in yaml.safe_load_all((deploy / "10-rbac.yaml").read_text()) if d["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    policy = next(yaml.safe_load_all((deploy / "11-admission-policy.yaml").read_text()))
    guarded = set(policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"])

    spec = make_spec(operator)
    volume_ref, ref = provision(spec)
    provision(spec)
    runtime = K8sRuntimeDriver()
    runtime.publish_branding(spec, {"primary_color": "#123456"})
    runtime.sleep(spec, grace_s=1)
    runtime.stop(spec, grace_s=1)
    runtime.delete(spec, ref)
    K8sVolumeDriver().delete(spec, volume_ref)

    used = {(*_resource_of(path), _VERBS[method]) for method, path in cluster.emulator.client_requests}
    assert ("", "pods", "delete") in used and ("apps", "statefulsets", "patch") in used  # the run did them
    assert used - granted == set(), f"RBAC does not grant: {sorted(used - granted)}"
    assert {r for _g, r, v in used if v != "get"} <= guarded
    assert all(v in ("get", "create", "patch", "delete") for _g, _r, v in granted)  # no list/watch/escalate



# --- the tenant's release as the pod's image (image releases: tests/releases/test_release_images.py)
# -------------------

def _image_release(version: str, fill: str) -> dict[str, str]:
    digest = "sha256:" + fill * 64
    return {"version": version, "digest": digest, "image": f"registry.example.com/acme/agent@{digest}", "env": ""}


def _container(cluster, ns: str) -> dict:  # type: ignore[no-untyped-def]
    sts = cluster.objects(ns)[("statefulsets", "agent-host")]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def _release_env(container: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("AGENT_RELEASE_")}


def test_an_image_release_is_the_pods_image_and_its_environment_names_it(cluster, operator, settings):
    from dataclasses import replace

    release = _image_release("1.4.0", "a")
    spec = replace(make_spec(operator), release=release)
    _volume_ref, ref = provision(spec)
    ns = ref.details["namespace"]
    container = _container(cluster, ns)
    assert container["image"] == release["image"] != settings.KUBERNETES_AGENT_IMAGE
    # Version and digest: what the host writes into its boot record, which the rollout checks.
    assert _release_env(container) == {"AGENT_RELEASE_VERSION": "1.4.0", "AGENT_RELEASE_DIGEST": release["digest"]}
    assert not any(k.startswith("AGENT_RELEASE_") for k in cluster.objects(ns)[("secrets", "agent-instance-env")]
                   ["stringData"])
    assert (ref.details["release_version"], ref.details["release_digest"]) == ("1.4.0", release["digest"])
    assert K8sRuntimeDriver().observe(spec, ref).healthy


def test_a_changed_assignment_changes_the_statefulset_and_no_release_keeps_the_runtime_image(
        cluster, operator, settings):
    """What a rollout or a pin does on Kubernetes: commit the assignment, then ``ensure`` the spec built from it."""
    from dataclasses import replace

    from releases.models import AgentRelease, ReleaseAssignment
    from releases.selectors import tenant_release_spec
    from releases.services import release_create_image
    from tenants.actors import SYSTEM
    from tests.vault.test_vault_helpers import make_tenant

    settings.PROVISIONING_PROFILE = "kubernetes"
    old, new = (release_create_image(operator=operator, image=r["image"], version=r["version"],
                                     kinds={"support": "Answers tickets"}, actor=SYSTEM)
                for r in (_image_release("1.4.0", "a"), _image_release("1.5.0", "b")))
    tenant = make_tenant(operator)
    base = make_spec(operator)

    def ensure_assigned(release: AgentRelease | None) -> tuple[dict, str]:  # type: ignore[type-arg]
        ReleaseAssignment.objects.update_or_create(tenant=tenant, defaults={"release": release})
        ref = K8sRuntimeDriver().ensure(replace(base, release=tenant_release_spec(tenant.pk)))
        return _container(cluster, ref.details["namespace"]), ref.details["namespace"]

    K8sVolumeDriver().ensure(base)
    container, ns = ensure_assigned(None)  # no release: today's image, nothing about a release
    assert container["image"] == settings.KUBERNETES_AGENT_IMAGE and _release_env(container) == {}
    posts = cluster.request_count("POST")

    container, _ = ensure_assigned(old)
    assert container["image"] == old.image
    assert _release_env(container)["AGENT_RELEASE_DIGEST"] == old.digest
    container, _ = ensure_assigned(new)  # the pod template changed: the StatefulSet replaces the pod
    assert container["image"] == new.image == f"registry.example.com/acme/agent@{new.digest}"
    assert _release_env(container) == {"AGENT_RELEASE_VERSION": "1.5.0", "AGENT_RELEASE_DIGEST": new.digest}
    assert cluster.request_count("POST") == posts  # the same StatefulSet, patched in place

    container, _ = ensure_assigned(None)  # back to the runtime's agents: its image, the release's variables gone
    assert container["image"] == settings.KUBERNETES_AGENT_IMAGE and _release_env(container) == {}
    assert len(cluster.objects(ns)) == 12  # nothing added beside the tenant's objects


def test_a_wheel_release_is_refused_before_anything_is_applied(cluster, operator, tmp_path):
    from dataclasses import replace

    wheel = {"version": "0.2.0", "digest": "sha256:" + "c" * 64, "image": "", "env": str(tmp_path)}
    spec = replace(make_spec(operator), release=wheel)
    with pytest.raises(ProvisioningError, match="release 0.2.0 .* is a wheel: Kubernetes instances run a container "
                                                "image"):
        K8sRuntimeDriver().ensure(spec)
    assert cluster.objects(K8sRuntimeDriver()._namespace(spec)) == {}
    broken = replace(spec, release={**_image_release("1.4.0", "a"), "digest": "sha256:" + "d" * 64})
    with pytest.raises(ProvisioningError, match="an image pinned by its digest"):
        K8sRuntimeDriver().ensure(broken)
