"""Image releases (the Kubernetes profile): a container image pinned by digest, registered through the real API.

Each profile takes the kind of release its instances run (a wheel on local processes, an image on Kubernetes)
and refuses the other with a 409 that says what to register instead. The local driver refuses an image spec and
the host names an image release in its boot record from its version and digest alone. The Kubernetes driver's
side (the StatefulSet's image and environment) is in tests/provisioning/test_k8s_driver.py.
"""

from __future__ import annotations

import base64
import os
import uuid
from dataclasses import replace

import pytest
from rest_framework.test import APIClient

from controlplane.errors import ProvisioningError
from provisioning.drivers.base import Ref, TenantId, TenantSpec
from provisioning.drivers.local_process import LocalProcessDriver
from releases.models import AgentRelease, ReleaseAssignment
from releases.selectors import release_env_dir, tenant_release_spec
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.releases.test_releases_upload import make_wheel, upload
from tests.vault.test_vault_helpers import assert_problem, make_tenant

pytestmark = pytest.mark.django_db

DIGEST = "sha256:" + "4f" * 32
IMAGE = f"registry.example.com/acme/agent@{DIGEST}"


@pytest.fixture
def kubernetes(settings):  # type: ignore[no-untyped-def]
    settings.PROVISIONING_PROFILE = "kubernetes"


def register(api, **fields):  # type: ignore[no-untyped-def]
    body = {"image": IMAGE, "version": "1.4.0", "kinds": {"support": "Answers tickets"}, **fields}
    return api.post("/api/v1/releases", body, format="json")


def test_an_image_pinned_by_digest_is_registered(api, kubernetes):
    created = register(api, notes="first image", default_config={"tone": "warm"},
                       egress=["API.openai.com", "*.stripe.com"])
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["egress"] == ["*.stripe.com", "api.openai.com"]  # an image declares its hosts as it does its kinds
    assert (body["image"], body["digest"], body["distribution"], body["version"]) == (
        IMAGE, DIGEST, "acme/agent", "1.4.0")
    assert (body["filename"], body["size_bytes"]) == ("", 0)
    assert body["kinds"] == {"support": "Answers tickets"} and body["default_config"] == {"tone": "warm"}
    assert body["notes"] == "first image" and body["created_by"]
    release = AgentRelease.objects.get(pk=body["id"])
    assert release.artifact_key == ""
    assert api.get(f"/api/v1/releases/{body['id']}").json() == body
    assert [r["id"] for r in api.get("/api/v1/releases").json()] == [body["id"]]
    audit = AuditLog.objects.get(action="release.create", target_id=body["id"])
    assert audit.data == {"version": "1.4.0", "digest": DIGEST, "image": IMAGE, "tag": "", "kinds": ["support"],
                          "connections": [], "egress": ["*.stripe.com", "api.openai.com"]}


def test_a_tag_beside_the_digest_is_dropped_and_a_registry_port_is_kept(api, kubernetes):
    tagged = register(api, image=f"registry.example.com/acme/agent:1.4@{DIGEST}").json()
    assert tagged["image"] == IMAGE and tagged["digest"] == DIGEST
    ported = register(api, version="1.4.1", image=f"localhost:5000/team/sub/agent-x_y.z:v2@{DIGEST}").json()
    assert ported["image"] == f"localhost:5000/team/sub/agent-x_y.z@{DIGEST}"
    assert ported["distribution"] == "team/sub/agent-x_y.z"


@pytest.mark.parametrize(("image", "needle"), [
    ("registry.example.com/acme/agent:1.4", "must be pinned by digest"),
    ("registry.example.com/acme/agent", "must be pinned by digest"),
    ("registry.example.com/acme/agent@sha256:" + "4F" * 32, "64 lowercase hexadecimal"),
    ("registry.example.com/acme/agent@sha256:" + "4f" * 31, "64 lowercase hexadecimal"),
    ("registry.example.com/acme/agent@sha512:" + "4f" * 64, "must be sha256:"),
    ("registry.example.com/acme/agent@" + "4f" * 32, "must be sha256:"),
    (f"acme/agent@{DIGEST}", "must name its registry"),
    (f"agent@{DIGEST}", "must name its registry"),
    (f"registry.example.com/Acme/agent@{DIGEST}", "repository 'Acme/agent' is not valid"),
    (f"registry.example.com/acme//agent@{DIGEST}", "is not valid"),
    (f"registry.example.com/acme/agent-@{DIGEST}", "is not valid"),
    (f"-bad-.example.com/acme/agent@{DIGEST}", "is not a host name"),
    (f"registry.example.com/acme/agent:-x@{DIGEST}", "is not a valid tag"),
    (f"registry.example.com/acme/agent @{DIGEST}", "whitespace"),
    (f"registry.example.com/{'a' * 250}@{DIGEST}", "longer than 255"),
])
def test_an_image_that_is_not_pinned_or_does_not_parse_is_refused(api, kubernetes, image, needle):
    problem = assert_problem(register(api, image=image), 400)
    assert needle in problem["detail"], problem
    assert not AgentRelease.objects.exists()


@pytest.mark.parametrize(("fields", "needle"), [
    ({"kinds": {}}, "kinds must be a non-empty object"),
    ({"kinds": {"Support": "x"}}, "agent kind 'Support' must match"),
    ({"kinds": {"9lives": "x"}}, "agent kind '9lives' must match"),
    ({"kinds": {"a" * 64: "x"}}, "must match"),
    ({"kinds": ["support"]}, "kinds: Expected a dictionary"),
    ({"kinds": {"support": 3}}, "kinds.support: must be a JSON string"),
    ({"version": ""}, "version: This field may not be blank"),
    ({"version": "1.4 beta"}, "version must be"),
    ({"version": "-1"}, "version must be"),
    ({"default_config": {"blob": "x" * 20_000}}, "default_config must be at most"),
    ({"default_config": "{}"}, "default_config: Expected a dictionary"),
    ({"is_admin": True}, "unknown fields: is_admin"),
    ({"egress": ["https://api.openai.com"]}, "an egress host is a host name"),
    ({"egress": ["*.com"]}, "an egress host is a host name"),
    ({"egress": "api.openai.com"}, "egress: Expected a list"),
])
def test_bad_versions_kinds_and_fields_are_refused(api, kubernetes, fields, needle):
    problem = assert_problem(register(api, **fields), 400)
    assert needle in problem["detail"], problem
    assert not AgentRelease.objects.exists()


def test_a_version_is_registered_once(api, kubernetes):
    assert register(api).status_code == 201
    problem = assert_problem(register(api, image=f"registry.example.com/acme/other@sha256:{'0' * 64}"), 409)
    assert "release 1.4.0 already exists" in problem["detail"]
    assert AgentRelease.objects.count() == 1


def test_a_wheel_is_refused_on_kubernetes_and_an_image_on_local_processes(api, settings):
    settings.PROVISIONING_PROFILE = "kubernetes"
    filename, data = make_wheel()
    problem = assert_problem(upload(api, filename, data), 409)
    assert problem["type"] == "/problems/release-artifact-unsupported" and problem["accepted"] == "image"
    assert "this control plane runs instances on Kubernetes: register a container image pinned by digest" in (
        problem["detail"])

    settings.PROVISIONING_PROFILE = "local"
    problem = assert_problem(register(api), 409)
    assert problem["type"] == "/problems/release-artifact-unsupported" and problem["accepted"] == "wheel"
    assert "runs instances as local processes: upload the agent as a wheel" in problem["detail"]
    assert not AgentRelease.objects.exists()


def test_the_deferred_runtime_takes_the_profiles_kind(api, settings):
    """``PROVISIONING_RUNTIME_DRIVER=deferred`` defers the start; the profile's driver still starts the pod."""
    settings.PROVISIONING_PROFILE, settings.PROVISIONING_RUNTIME_DRIVER = "kubernetes", "deferred"
    assert register(api).status_code == 201


def test_another_operators_image_release_does_not_exist(api, kubernetes, make_token):
    mine = register(api).json()
    other = APIClient()
    theirs = operator_create(slug="img-other", name="O", actor=SYSTEM)
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(theirs)}")
    assert_problem(other.get(f"/api/v1/releases/{mine['id']}"), 404)
    assert other.get("/api/v1/releases").json() == []
    # Their own 1.4.0 is theirs: versions are per operator.
    assert register(other).status_code == 201


def test_the_tenants_spec_carries_the_image_and_no_install_directory(api, operator, kubernetes):
    release = AgentRelease.objects.get(pk=register(api).json()["id"])
    tenant = make_tenant(operator)
    assert tenant_release_spec(tenant.pk) == {}
    ReleaseAssignment.objects.create(tenant=tenant, release=release)
    assert tenant_release_spec(tenant.pk) == {"version": "1.4.0", "digest": DIGEST, "image": IMAGE, "env": "",
                                              "kinds": "support"}


def test_a_wheels_spec_keeps_its_install_directory_and_no_image(operator):
    wheel = AgentRelease.objects.create(operator=operator, version="0.2.0", distribution="hello-agent",
                                        digest="sha256:" + "1" * 64, filename="w.whl", size_bytes=1,
                                        artifact_key="wheels/x.whl", kinds={"hello": ""})
    tenant = make_tenant(operator)
    ReleaseAssignment.objects.create(tenant=tenant, release=wheel)
    assert tenant_release_spec(tenant.pk) == {"version": "0.2.0", "digest": wheel.digest, "image": "",
                                              "env": str(release_env_dir(wheel.digest)), "kinds": "hello"}


def test_the_local_driver_refuses_an_image_release_before_making_anything(tmp_path, operator):
    volume = tmp_path / "volume"
    spec = TenantSpec(tenant_id=TenantId(str(uuid.uuid4())), resource_name="t_x", operator_slug=operator.slug,
                      resources={"volume": Ref(str(volume), {"path": str(volume)})},
                      release={"version": "1.4.0", "digest": DIGEST, "image": IMAGE, "env": ""})
    with pytest.raises(ProvisioningError, match="is a container image .*image releases run on the Kubernetes"):
        LocalProcessDriver().ensure(spec)
    assert not volume.exists()
    with pytest.raises(ProvisioningError, match="is a container image"):
        LocalProcessDriver().ensure(replace(spec, release={**spec.release, "env": str(tmp_path)}))


def test_the_kind_rule_is_the_runtimes():
    from agent_runtime.sdk.agent import _KIND
    from releases.services import KIND_PATTERN

    assert KIND_PATTERN.pattern == _KIND.pattern


def test_the_host_names_an_image_release_from_its_version_and_digest_alone(tmp_path):
    from agent_runtime.host.config import HostConfig

    env = {"AGENT_TENANT_ID": str(uuid.uuid4()), "AGENT_SCHEMA": "t_x", "AGENT_DATABASE_URL": "postgresql://x/y",
           "AGENT_VOLUME": str(tmp_path), "AGENT_OBJECTSTORE_URL": f"file://{tmp_path}/objects",
           "AGENT_OBJECT_KEY": base64.b64encode(os.urandom(32)).decode()}
    assert HostConfig.from_env(env).release is None
    image = HostConfig.from_env({**env, "AGENT_RELEASE_VERSION": "1.4.0", "AGENT_RELEASE_DIGEST": DIGEST})
    assert image.release_path is None and image.release == {"version": "1.4.0", "digest": DIGEST}


def test_an_image_declares_its_connections_with_it(api, kubernetes):
    """No probe runs an image: the connections its agents use are declared with it, like its kinds (issue 33)."""
    refused = register(api, connections=["google", "not a slug"])
    assert refused.status_code == 400 and "not a slug" in refused.json()["detail"]
    created = register(api, connections=["slack", "google", "google"])
    assert created.status_code == 201, created.content
    assert created.json()["connections"] == ["google", "slack"]
    assert AgentRelease.objects.get(pk=created.json()["id"]).connections == ["google", "slack"]
