"""Rendered tenant objects: valid against the official Kubernetes schemas, and isolated from each other.

Pure rendering, no API: every object validates (strict: unknown fields are errors) against the
pinned Kubernetes version; a tenant's workload can reference only objects of its own namespace;
NetworkPolicies deny everything not explicitly allowed and never allow another tenant; no
ServiceAccount token reaches the pod; the pod runs under the restricted security profile.
"""

from __future__ import annotations

import uuid

import kubernetes_validate
import pytest

from provisioning.drivers.k8s_manifests import (
    LABEL_TENANT,
    NAMES,
    ClusterConfig,
    egress_target,
    namespace_name,
    plans_from_mapping,
    pvc_object,
    runtime_objects,
)

K8S_VERSION = "1.31.0"  # the oldest version we support; schemas ship with kubernetes-validate (offline)
PREFIX = "tenant-"


def config(**overrides) -> ClusterConfig:
    values = dict(
        namespace_prefix=PREFIX,
        image="registry.example/agent-host:1.0",
        plans=plans_from_mapping({
            "standard": {"cpu_request": "250m", "cpu_limit": "1", "memory_request": "512Mi",
                         "memory_limit": "1Gi", "storage": "5Gi"},
            "large": {"cpu_request": "1", "cpu_limit": "2", "memory_request": "2Gi",
                      "memory_limit": "4Gi", "storage": "50Gi"},
        }),
        control_plane=egress_target(ports=[8000], namespace="agent-control-plane",
                                    pod_labels={"app.kubernetes.io/name": "agent-control-plane"}),
        dns=egress_target(ports=[53], namespace="kube-system", pod_labels={"k8s-app": "kube-dns"},
                          protocols=("UDP", "TCP")),
        postgres=egress_target(ports=[5432], cidrs=["10.20.0.0/24"]),
        objectstore=egress_target(ports=[443], cidrs=["10.30.0.0/24"], namespace="minio"),
        storage_class="fast-ssd",
    )
    values.update(overrides)
    return ClusterConfig(**values)


def tenant(cfg: ClusterConfig, *, plan: str = "standard") -> tuple[str, list[dict]]:
    tenant_id = str(uuid.uuid4())
    ns = namespace_name(f"t_{uuid.UUID(tenant_id).hex}", cfg.namespace_prefix)
    objects = runtime_objects(
        namespace=ns, tenant_id=tenant_id, operator_slug="acme", plan_name=plan, cfg=cfg,
        secret_data={"AGENT_TENANT_ID": tenant_id, "AGENT_DATABASE_URL": f"postgresql://{ns}:pw@db/x"},
        branding={"product_name": "Acme Agent", "primary_color": "#123456"},
    )
    pvc = pvc_object(namespace=ns, tenant_id=tenant_id, operator_slug="acme", plan=cfg.plan(plan), cfg=cfg)
    return ns, [*objects, pvc]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(objects: list[dict]) -> dict:
    (sts,) = by_kind(objects, "StatefulSet")
    return sts["spec"]["template"]["spec"]


@pytest.mark.parametrize("plan", ["standard", "large"])
def test_every_rendered_object_validates_against_the_kubernetes_schema(plan):
    cfg = config(image_pull_secret="regcred")
    _ns, objects = tenant(cfg, plan=plan)
    assert len(objects) == 12
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_schema_violation_is_caught():
    _ns, objects = tenant(config())
    broken = by_kind(objects, "StatefulSet")[0]
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_namespace_names_are_dns_labels_derived_from_the_tenant_id():
    hexid = uuid.uuid4().hex
    assert namespace_name(f"t_{hexid}", "agent-") == f"agent-t-{hexid}"
    assert namespace_name(f"ttab12_{hexid}", "agent-") == f"agent-ttab12-{hexid}"
    with pytest.raises(ValueError):
        namespace_name("t_" + "a" * 70, "agent-")
    with pytest.raises(ValueError):
        namespace_name("t_bad.name", "agent-")


def test_every_object_lives_in_its_tenant_namespace_and_the_workload_references_only_its_own():
    cfg = config()
    ns_a, objects_a = tenant(cfg)
    ns_b, objects_b = tenant(cfg)
    assert ns_a != ns_b
    for ns, objects in ((ns_a, objects_a), (ns_b, objects_b)):
        namespaced = [o for o in objects if o["kind"] != "Namespace"]
        assert {o["metadata"]["namespace"] for o in namespaced} == {ns}
        tenant_id = by_kind(objects, "Namespace")[0]["metadata"]["labels"][LABEL_TENANT]
        assert {o["metadata"]["labels"][LABEL_TENANT] for o in objects} == {tenant_id}

        own = {(o["kind"], o["metadata"]["name"]) for o in namespaced}
        spec = pod_spec(objects)
        referenced = set()
        for volume in spec["volumes"]:
            if "persistentVolumeClaim" in volume:
                referenced.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
            if "secret" in volume:
                referenced.add(("Secret", volume["secret"]["secretName"]))
            if "configMap" in volume:
                referenced.add(("ConfigMap", volume["configMap"]["name"]))
            # Nothing that can reach outside the pod's namespace or onto the node.
            assert set(volume) & {"hostPath", "projected", "nfs", "csi", "ephemeral"} == set(), volume
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                referenced.add(("Secret", source["secretRef"]["name"]))
        referenced.add(("ServiceAccount", spec["serviceAccountName"]))
        # Kubernetes resolves these names in the pod's own namespace: every one exists there.
        assert referenced <= own, referenced - own
        assert ("PersistentVolumeClaim", NAMES.pvc) in referenced
        assert ("Secret", NAMES.secret) in referenced


def test_no_service_account_token_is_mounted():
    _ns, objects = tenant(config())
    (sa,) = by_kind(objects, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    spec = pod_spec(objects)
    assert spec["automountServiceAccountToken"] is False
    assert all("projected" not in v for v in spec["volumes"])
    assert all("/var/run/secrets" not in m["mountPath"]
               for c in spec["containers"] for m in c.get("volumeMounts", []))


def test_network_policies_deny_by_default_and_never_allow_other_tenants():
    cfg = config()
    ns, objects = tenant(cfg)
    policies = {p["metadata"]["name"]: p for p in by_kind(objects, "NetworkPolicy")}
    deny = policies[NAMES.deny_all]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}

    allowed_namespaces = {"kube-system", "agent-control-plane", "minio"}
    egress_ports = set()
    for policy in policies.values():
        spec = policy["spec"]
        for rule in spec.get("egress", []) + spec.get("ingress", []):
            peers = rule.get("to", rule.get("from"))
            assert peers, f"{policy['metadata']['name']}: a rule without peers allows everyone"
            assert rule.get("ports"), "every allow names its ports"
            for peer in peers:
                if "ipBlock" in peer:
                    assert peer["ipBlock"]["cidr"] not in ("0.0.0.0/0", "::/0")
                    continue
                selector = peer["namespaceSelector"]
                assert selector != {}, "an empty namespaceSelector means every namespace"
                target = selector["matchLabels"]["kubernetes.io/metadata.name"]
                assert target in allowed_namespaces
                assert not target.startswith(PREFIX), "never another tenant's namespace"
                assert target != ns
            egress_ports |= {p["port"] for p in rule["ports"]} if "to" in rule else set()
    assert egress_ports == {53, 8000, 5432, 443}
    ingress = policies[NAMES.allow_ingress]["spec"]["ingress"]
    assert [p["namespaceSelector"]["matchLabels"] for p in ingress[0]["from"]] == [
        {"kubernetes.io/metadata.name": "agent-control-plane"}
    ]


def test_unconfigured_egress_targets_allow_nothing():
    cfg = config(postgres=egress_target(ports=[5432]), objectstore=egress_target(ports=[443]))
    _ns, objects = tenant(cfg)
    egress = next(p for p in by_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == NAMES.allow_egress)
    ports = {p["port"] for rule in egress["spec"]["egress"] for p in rule["ports"]}
    assert ports == {53, 8000}


def test_pod_security_restricted_profile():
    cfg = config()
    _ns, objects = tenant(cfg)
    (namespace,) = by_kind(objects, "Namespace")
    for mode in ("enforce", "warn", "audit"):
        assert namespace["metadata"]["labels"][f"pod-security.kubernetes.io/{mode}"] == "restricted"
    spec = pod_spec(objects)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["terminationGracePeriodSeconds"] == cfg.grace_period_s + cfg.flush_margin_s
    (container,) = spec["containers"]
    ctx = container["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["AGENT_GRACE_PERIOD_S"]) < spec["terminationGracePeriodSeconds"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}


def test_one_writer_workload_and_quota_from_the_plan():
    cfg = config()
    _ns, standard = tenant(cfg)
    _ns, large = tenant(cfg, plan="large")
    (sts,) = by_kind(standard, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["podManagementPolicy"] == "OrderedReady"
    quota_s = by_kind(standard, "ResourceQuota")[0]["spec"]["hard"]
    quota_l = by_kind(large, "ResourceQuota")[0]["spec"]["hard"]
    assert (quota_s["limits.memory"], quota_l["limits.memory"]) == ("1Gi", "4Gi")
    assert (quota_s["requests.storage"], quota_l["requests.storage"]) == ("5Gi", "50Gi")
    assert quota_s["persistentvolumeclaims"] == "1"
    assert quota_s["services.loadbalancers"] == "0" and quota_s["services.nodeports"] == "0"
    (pvc,) = by_kind(large, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert pvc["spec"]["storageClassName"] == "fast-ssd"
    with pytest.raises(ValueError, match="plan"):
        tenant(cfg, plan="nonexistent")


def test_a_changed_secret_changes_the_pod_template():
    cfg = config()
    ns = namespace_name(f"t_{uuid.uuid4().hex}", PREFIX)
    common = dict(namespace=ns, tenant_id=str(uuid.uuid4()), operator_slug="acme", plan_name="standard", cfg=cfg,
                  branding={})
    first = runtime_objects(secret_data={"AWS_SESSION_TOKEN": "a"}, **common)
    again = runtime_objects(secret_data={"AWS_SESSION_TOKEN": "a"}, **common)
    renewed = runtime_objects(secret_data={"AWS_SESSION_TOKEN": "b"}, **common)
    assert first == again

    def annotations(objs: list[dict]) -> dict:
        return by_kind(objs, "StatefulSet")[0]["spec"]["template"]["metadata"]["annotations"]

    assert annotations(first) != annotations(renewed)


def test_a_release_image_replaces_the_runtime_image_and_validates():
    from provisioning.drivers.k8s_manifests import ReleaseImage

    cfg = config()
    ns = namespace_name(f"t_{uuid.uuid4().hex}", PREFIX)
    common = dict(namespace=ns, tenant_id=str(uuid.uuid4()), operator_slug="acme", plan_name="standard", cfg=cfg,
                  secret_data={"AGENT_TENANT_ID": "x"}, branding={})
    digest = "sha256:" + "e" * 64
    release = ReleaseImage(image=f"registry.example.com/acme/agent@{digest}", version="1.4.0", digest=digest)
    plain, released = runtime_objects(**common), runtime_objects(release=release, **common)
    (before,), (after,) = pod_spec(plain)["containers"], pod_spec(released)["containers"]
    assert (before["image"], after["image"]) == (cfg.image, release.image)
    assert [e for e in after["env"] if e not in before["env"]] == [
        {"name": "AGENT_RELEASE_VERSION", "value": "1.4.0"}, {"name": "AGENT_RELEASE_DIGEST", "value": digest}]
    # Only the pod template differs: the Secret (and so its revision) is the same with or without a release.
    assert [o for o in plain if o["kind"] != "StatefulSet"] == [o for o in released if o["kind"] != "StatefulSet"]
    for obj in by_kind(released, "StatefulSet"):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
