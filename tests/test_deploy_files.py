"""deploy/: every Kubernetes manifest validates against the pinned official schemas; RBAC is least privilege;
the compose file and Dockerfiles describe the stack the docs promise."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from provisioning.drivers.k8s_client import _RESOURCES

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S_VERSION = "1.31.0"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    return found


def test_there_are_manifests():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _name, doc in documents()}
    assert {("Deployment", "web"), ("Deployment", "worker"), ("Deployment", "beat"), ("Job", "controlplane-migrate"),
            ("ClusterRole", "agent-control-plane-provisioner"), ("ServiceAccount", "controlplane"),
            ("Deployment", "instance-watcher"), ("ClusterRole", "agent-control-plane-instance-watcher"),
            ("ServiceAccount", "instance-watcher"), ("Namespace", "agent-control-plane")} <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_yaml_in_deploy_is_either_a_manifest_or_the_compose_file():
    yamls = sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.y*ml"))
    assert yamls == ["compose.yaml"] + [f"kubernetes/{p.name}" for p in MANIFESTS]


def _grants(role: dict) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "deletecollection"}
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    return granted


def _cluster_role(name: str) -> dict:
    (role,) = [d for _n, d in documents() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    return role


def test_the_cluster_roles_are_the_provisioners_and_the_pod_watchers():
    names = sorted(d["metadata"]["name"] for _n, d in documents() if d["kind"] in ("ClusterRole", "Role"))
    assert names == ["agent-control-plane-instance-watcher", "agent-control-plane-provisioner"]
    bindings = {d["roleRef"]["name"]: [(s["kind"], s["name"]) for s in d["subjects"]]
                for _n, d in documents() if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert bindings == {"agent-control-plane-provisioner": [("ServiceAccount", "controlplane")],
                        "agent-control-plane-instance-watcher": [("ServiceAccount", "instance-watcher")]}


def test_the_pod_watcher_may_only_read_pods():
    """provisioning/recovery/pod_watch.py lists and watches the agent pods and reads one back
    (tests/provisioning/test_pod_watch.py
    checks these are the calls it makes); it changes nothing in the cluster."""
    assert _grants(_cluster_role("agent-control-plane-instance-watcher")) == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch")}


def test_cluster_role_grants_exactly_what_the_drivers_do():
    granted = _grants(_cluster_role("agent-control-plane-provisioner"))
    assert not {v for _g, _r, v in granted} & {"list", "watch"}
    needed = set()
    for (api_version, kind), (plural, _namespaced) in _RESOURCES.items():
        if kind == "Pod":
            continue  # never applied: read and deleted, to stop or restart an instance (stop waits for it to go)
        group = api_version.rpartition("/")[0]
        for verb in ("get", "create", "patch"):  # server-side apply, create fallback, observe
            needed.add((group, plural, verb))
    needed |= {("", "namespaces", "delete"), ("", "persistentvolumeclaims", "delete"), ("", "pods", "delete"),
               ("", "pods", "get")}
    assert granted == needed


def test_only_the_worker_and_the_pod_watcher_get_an_api_token():
    pods = {}
    for _name, doc in documents():
        if doc["kind"] in ("Deployment", "Job"):
            pods[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
    tokens = {name: spec["serviceAccountName"] for name, spec in pods.items()
              if spec.get("automountServiceAccountToken")}
    assert tokens == {"worker": "controlplane", "instance-watcher": "instance-watcher"}
    for name, spec in pods.items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert container["resources"]["limits"], name


@pytest.mark.parametrize("name", ["beat", "instance-watcher"])
def test_singletons_run_a_standby_and_roll_without_a_gap(name):
    """Issue 40: one leads through a lease (controlplane.leases), so a second replica is a standby, not a double;
    a rolling update keeps one running while the other is replaced."""
    (deployment,) = [d for _n, d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}}


def test_beat_runs_the_leader_scheduler_everywhere():
    (beat,) = [d for _n, d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "beat"]
    (container,) = beat["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[command.index("--scheduler") + 1] == "controlplane.leases.beat:LeaderScheduler"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert "controlplane.leases.beat:LeaderScheduler" in compose["services"]["beat"]["command"]
    assert compose["services"]["beat"]["deploy"]["replicas"] == 2  # the standby, as in 60-beat.yaml


def test_the_pod_watcher_runs_the_management_command():
    (watcher,) = [d for _n, d in documents()
                  if d["kind"] == "Deployment" and d["metadata"]["name"] == "instance-watcher"]
    (container,) = watcher["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "manage.py", "watch_instances"]


def test_compose_file_runs_the_whole_stack():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "minio", "web", "worker", "beat", "migrate"} <= set(services)
    for name in ("web", "worker", "beat", "migrate"):
        service = services[name]
        dockerfile = DEPLOY.parent / service["build"]["context"].replace("..", ".") / service["build"]["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        env = service["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in env["DATABASE_URL"]
        # The broker asks for a password even on one machine (the isolation posture fails an open Redis).
        assert env["CELERY_BROKER_URL"] == "redis://:${REDIS_PASSWORD:-redis-dev-only}@redis:6379/0"
        assert env["S3_ENDPOINT_URL"] == "http://minio:9000"
        assert service["read_only"] is True
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == "${REDIS_PASSWORD:-redis-dev-only}"
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize("dockerfile", sorted((DEPLOY / "docker").glob("*.Dockerfile")), ids=lambda p: p.name)
def test_dockerfiles_run_as_non_root_and_copy_what_exists(dockerfile):
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (DEPLOY.parent / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
