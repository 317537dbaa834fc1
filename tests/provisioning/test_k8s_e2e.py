"""End to end: PROVISIONING_PROFILE=kubernetes onboards and deprovisions a tenant through the workflow engine.

Real PostgreSQL (tenant schema and role), kmock's Kubernetes emulator and moto's S3/STS over
HTTP. The emulator runs no pods: "ready" is the StatefulSet status the fake kubelet reports.
"""

from __future__ import annotations

import base64

import boto3
import pytest

from provisioning.choices import ResourceStatus, WorkflowKind
from provisioning.models import AgentInstance, ProvisionedResource, WorkflowRun
from provisioning.workflows.engine import Outcome, RetryLater, workflow_execute
from provisioning.workflows.onboarding import tenant_deprovision, tenant_onboard
from tenants.actors import SYSTEM
from tenants.choices import TenantStatus
from tenants.models import Tenant
from tests.conftest import RUN_ID
from tests.k8s_fixtures import moto_server, run_cluster
from vault.services import tenant_object_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def moto_url():
    with moto_server() as url:
        yield url


@pytest.fixture
def k8s_cluster(tmp_path, settings):
    yield from run_cluster(tmp_path, settings)


@pytest.fixture
def production(k8s_cluster, moto_url, settings, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "cp-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cp-test-secret")
    settings.PROVISIONING_PROFILE = "kubernetes"
    settings.PROVISIONING_RUNTIME_DRIVER = ""
    settings.S3_BUCKET = f"tenants-{RUN_ID}"
    settings.S3_ENDPOINT_URL = moto_url
    settings.S3_INSTANCE_ENDPOINT_URL = "http://minio.storage.svc:9000"
    settings.S3_STS_ENDPOINT_URL = moto_url
    settings.S3_REGION = "us-east-1"
    settings.S3_CREATE_BUCKET = True
    settings.S3_ACCESS_KEY_ID = "cp-test"
    settings.S3_SECRET_ACCESS_KEY = "cp-test-secret"
    settings.S3_ROLE_ARN = "arn:aws:iam::123456789012:role/agent-tenant-objects"
    settings.S3_CREDENTIALS_DURATION_S = 3600
    settings.S3_CREDENTIALS_RENEW_BEFORE_S = 600
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                      aws_access_key_id="cp-test", aws_secret_access_key="cp-test-secret")
    return k8s_cluster, s3


def run_to_end(tenant: Tenant, kind: str) -> None:
    run = WorkflowRun.objects.filter(tenant=tenant, kind=kind).latest("created_at")
    for _attempt in range(3):
        try:
            outcome = workflow_execute(str(run.pk))
        except RetryLater as retry:
            pytest.fail(f"{kind} step failed: {retry.reason}")
        if outcome != Outcome.BUSY:
            break
    assert outcome == Outcome.SUCCEEDED, list(run.steps.values_list("name", "status", "error"))


def test_kubernetes_profile_onboards_and_deprovisions_a_tenant(production, operator):
    cluster, s3 = production
    tenant, created = tenant_onboard(operator=operator, slug="acme-k8s", name="Acme K8s",
                                     actor=SYSTEM, allow_no_release=True)
    assert created
    run_to_end(tenant, WorkflowKind.ONBOARD)

    tenant.refresh_from_db()
    assert tenant.status == TenantStatus.READY
    resources = {r.kind: r for r in ProvisionedResource.objects.filter(tenant=tenant)}
    assert {k: r.driver for k, r in resources.items()} == {
        "database": "postgres-schema", "volume": "k8s-pvc", "objectstore": "s3-prefix",
        "vault": "vault-envelope", "runtime": "k8s-statefulset",
    }
    ns = resources["runtime"].details["namespace"]
    assert ns == "tenant-" + tenant.resource_name.replace("_", "-")
    instance = AgentInstance.objects.get(tenant=tenant)
    assert instance.endpoint == f"http://agent-host-0.agent-host.{ns}.svc:8080"
    assert instance.driver == "k8s-statefulset"

    objects = cluster.objects(ns)
    assert ("statefulsets", "agent-host") in objects and ("persistentvolumeclaims", "agent-data") in objects
    env = objects[("secrets", "agent-instance-env")]["stringData"]
    assert env["AGENT_TENANT_ID"] == str(tenant.id)
    assert env["AGENT_SCHEMA"] == tenant.resource_name
    assert env["AGENT_VOLUME"] == "/data"
    assert env["AGENT_OBJECTSTORE_URL"] == f"s3://tenants-{RUN_ID}/tenants/{tenant.id}/"
    assert base64.b64decode(env["AGENT_OBJECT_KEY"]) == tenant_object_key(tenant=tenant)
    assert env["AWS_ENDPOINT_URL_S3"] == "http://minio.storage.svc:9000"
    assert env["AWS_SESSION_TOKEN"] and env["AWS_ACCESS_KEY_ID"] != "cp-test"  # vended, not ours
    assert "cp-test-secret" not in str(objects)
    assert "AWS_SECRET_ACCESS_KEY" not in str(resources["objectstore"].details)
    marker = s3.head_object(Bucket=f"tenants-{RUN_ID}", Key=f"tenants/{tenant.id}/.tenant")
    assert marker["Metadata"]["tenant-id"] == str(tenant.id)
    branding = objects[("configmaps", "agent-branding")]["data"]
    assert branding["product_name"] == operator.product_name

    # A second onboarding pass (a resumed or repeated run) reuses the vended credentials: no change.
    from provisioning.drivers.registry import driver_for
    from provisioning.resources.spec import tenant_spec

    before = cluster.objects(ns)
    driver_for("runtime").ensure(tenant_spec(tenant, with_secrets=("db_password", "object_key_b64",
                                                                   "instance_token")))
    assert {k: {f: v for f, v in o.items() if f != "status"} for k, o in cluster.objects(ns).items()} == \
        {k: {f: v for f, v in o.items() if f != "status"} for k, o in before.items()}

    tenant_deprovision(tenant=tenant, actor=SYSTEM)
    run_to_end(tenant, WorkflowKind.DEPROVISION)
    tenant.refresh_from_db()
    assert tenant.status == TenantStatus.DELETED
    assert cluster.http("GET", f"/api/v1/namespaces/{ns}") is None
    assert cluster.objects(ns) == {}
    listing = s3.list_objects_v2(Bucket=f"tenants-{RUN_ID}", Prefix=f"tenants/{tenant.id}/")
    assert listing.get("KeyCount", 0) == 0
    archives = s3.list_objects_v2(Bucket=f"tenants-{RUN_ID}", Prefix=f"archives/{tenant.id}/").get("Contents", [])
    assert len(archives) == 1 and archives[0]["Key"].endswith(".sql.gz.enc")
    assert set(ProvisionedResource.objects.filter(tenant=tenant).values_list("status", flat=True)) == {
        ResourceStatus.DELETED
    }
