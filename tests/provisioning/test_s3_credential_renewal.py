"""S3 session credentials: at most 1 h, and renewed by a running instance before they expire (issue 16.6).

Against moto's S3/STS server over HTTP **with its IAM authentication on**: every request must be
signed by a key moto issued (the control plane's IAM user, or an AssumeRole session), so a client
holding stale or made-up credentials is refused, as AWS would. The control plane runs as a live
server; the instance side is the runtime's own S3 client (``agent_runtime.state.s3_credentials``),
which fetches fresh credentials from ``/internal/v1/s3-credentials/<tenant>`` with its instance token.
"Expiry" at the peer is moto forgetting a session (what AWS does at its Expiration), since moto
itself never expires one.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

from agent_runtime.errors import CredentialUnavailable
from agent_runtime.state.objectstore_s3 import S3ObjectStore
from agent_runtime.state.s3_credentials import ControlPlaneS3Credentials, instance_s3_client
from controlplane.errors import ProvisioningError
from provisioning.drivers.s3_objectstore import S3ObjectStoreDriver, vend_credentials
from provisioning.models import ProvisionedResource
from provisioning.resources.spec import tenant_spec
from tenants.models import AuditLog
from tests.conftest import subprocess_env
from tests.k8s_fixtures import moto_server
from tests.vault.test_vault_helpers import make_instance, make_tenant

ACCOUNT = "123456789012"
_ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@pytest.fixture(scope="module")
def moto_iam() -> Iterator[dict[str, str]]:
    """moto with authentication on; an IAM user for the control plane and the role it vends sessions of.

    moto's backends are global to the process (every moto server in it shares them): names are unique.
    """
    import moto.settings

    user, role = f"control-plane-{uuid.uuid4().hex[:8]}", f"agent-tenant-objects-{uuid.uuid4().hex[:8]}"
    with moto_server() as url:
        anon = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "setup",
                "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **anon)
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {
            "AWS": f"arn:aws:iam::{ACCOUNT}:user/{user}"}}]}
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))
        iam.put_role_policy(RoleName=role, PolicyName="objects", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        before = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from here on, every request is authenticated
        try:
            yield {"url": url, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                   "role_arn": f"arn:aws:iam::{ACCOUNT}:role/{role}"}
        finally:
            moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = before


def _sessions() -> list[Any]:
    """The AssumeRole sessions moto's STS currently honours (moto runs in this process)."""
    from moto.sts.models import sts_backends

    return list(sts_backends[ACCOUNT]["aws"].assumed_roles)


def _expire_at_the_peer(access_key_id: str) -> None:
    from moto.sts.models import sts_backends

    roles = sts_backends[ACCOUNT]["aws"].assumed_roles
    roles[:] = [r for r in roles if r.access_key_id != access_key_id]


@pytest.fixture
def s3(moto_iam, settings) -> dict[str, str]:
    settings.S3_BUCKET = f"bucket-{uuid.uuid4().hex[:12]}"
    settings.S3_ENDPOINT_URL = moto_iam["url"]
    settings.S3_STS_ENDPOINT_URL = moto_iam["url"]
    settings.S3_REGION = "us-east-1"
    settings.S3_CREATE_BUCKET = True
    settings.S3_ACCESS_KEY_ID = moto_iam["key"]
    settings.S3_SECRET_ACCESS_KEY = moto_iam["secret"]
    settings.S3_ROLE_ARN = moto_iam["role_arn"]
    settings.S3_CREDENTIALS_DURATION_S = 3600
    settings.S3_CREDENTIALS_RENEW_BEFORE_S = 900
    settings.S3_ROLE_SESSION_NOT_CHAINED = False
    return moto_iam


def _tenant_with_store(operator, slug: str) -> tuple[Any, str]:  # type: ignore[no-untyped-def]
    """A tenant whose object store was ensured (prefix marker, resource row) and whose instance has a token."""
    tenant = make_tenant(operator, slug)
    ref = S3ObjectStoreDriver().ensure(tenant_spec(tenant))
    ProvisionedResource.objects.create(tenant=tenant, kind="objectstore", driver=S3ObjectStoreDriver.name,
                                       external_id=ref.external_id, details=ref.details, status="ready")
    return tenant, make_instance(tenant)


@pytest.fixture
def fleet(s3, operator, live_server) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    a, token_a = _tenant_with_store(operator, "acme")
    b, token_b = _tenant_with_store(operator, "globex")
    return {"a": a, "b": b, "token_a": token_a, "token_b": token_b, "cp_url": live_server.url, "s3_url": s3["url"]}


def _boot_env(fleet: dict[str, Any], tenant: Any, token: str, **extra: str) -> dict[str, str]:
    """The instance's environment as its Secret sets it: the credentials vended at ensure are the first ones."""
    env = {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": fleet["s3_url"],
           "AGENT_CONTROL_PLANE_URL": fleet["cp_url"], "AGENT_INSTANCE_TOKEN": token,
           **vend_credentials(tenant_spec(tenant))}
    env.update(extra)
    return env


def _store(env: dict[str, str], tenant: Any) -> S3ObjectStore:
    from django.conf import settings

    prefix = f"tenants/{tenant.pk}/"
    return S3ObjectStore(instance_s3_client(env, tenant_id=str(tenant.pk), prefix=prefix), settings.S3_BUCKET, prefix)


def _renewals(tenant: Any) -> int:
    return AuditLog.objects.filter(action="objectstore.credentials_renew", tenant=tenant).count()


def _secrets_of_every_session() -> list[str]:
    return [v for r in _sessions() for v in (r.secret_access_key, r.session_token)]


@pytest.fixture
def logs(caplog):  # type: ignore[no-untyped-def]
    """Everything logged at the production level, and our own loggers (and botocore's refresher) at DEBUG."""
    caplog.set_level(logging.INFO)
    for name in ("agent_runtime", "provisioning", "vault", "botocore.credentials"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


# --- (a) duration: one hour by default, twelve refused ---------------------------------------------------------


def _settings_at_start(**env: str) -> subprocess.CompletedProcess[str]:
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.S3_CREDENTIALS_DURATION_S, s.S3_CREDENTIALS_RENEW_BEFORE_S)")
    base = {k: v for k, v in subprocess_env().items() if not k.startswith("S3_")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_default_duration_is_one_hour_and_twelve_hours_refuses_to_start():
    default = _settings_at_start()
    assert default.returncode == 0, default.stderr[-2000:]
    assert default.stdout.split() == ["3600", "900"]

    refused = _settings_at_start(S3_CREDENTIALS_DURATION_S="43200")
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: S3_CREDENTIALS_DURATION_S=43200 exceeds")
    assert "3600" in last and "S3_ROLE_SESSION_NOT_CHAINED=true" in last

    # The operator's explicit word that the role is not chained lifts the 1 h limit (STS's 12 h remains).
    not_chained = _settings_at_start(S3_CREDENTIALS_DURATION_S="43200", S3_ROLE_SESSION_NOT_CHAINED="true")
    assert not_chained.returncode == 0, not_chained.stderr[-2000:]
    assert not_chained.stdout.split() == ["43200", "900"]
    over_sts = _settings_at_start(S3_CREDENTIALS_DURATION_S="50000", S3_ROLE_SESSION_NOT_CHAINED="true")
    assert "above the 43200 s STS accepts" in over_sts.stderr
    renew_all_the_time = _settings_at_start(S3_CREDENTIALS_RENEW_BEFORE_S="3600")
    assert "S3_CREDENTIALS_RENEW_BEFORE_S=3600 must be above 0 and below" in renew_all_the_time.stderr


def test_vending_refuses_a_chained_session_over_an_hour_before_asking_sts(s3, settings, operator):
    tenant = make_tenant(operator, "acme")
    spec = tenant_spec(tenant)
    vended = vend_credentials(spec)
    left = datetime.fromisoformat(vended["AWS_CREDENTIAL_EXPIRATION"]) - datetime.now(UTC)
    assert timedelta(seconds=3500) < left <= timedelta(seconds=3600)

    sessions = len(_sessions())
    settings.S3_CREDENTIALS_DURATION_S = 43200  # changed under a running process: checked again at the vend
    with pytest.raises(ProvisioningError, match="exceeds the 3600 s AWS allows for a chained role session"):
        vend_credentials(spec)
    assert len(_sessions()) == sessions  # refused here, not by STS with an error naming no setting

    settings.S3_ROLE_SESSION_NOT_CHAINED = True
    left = datetime.fromisoformat(vend_credentials(spec)["AWS_CREDENTIAL_EXPIRATION"]) - datetime.now(UTC)
    assert left > timedelta(hours=11)


# --- (b) renewal of a running instance, no restart --------------------------------------------------------------


def test_a_running_instance_renews_its_credentials_before_expiry_and_keeps_its_prefix(fleet, settings, logs):
    a, b = fleet["a"], fleet["b"]
    settings.S3_CREDENTIALS_DURATION_S, settings.S3_CREDENTIALS_RENEW_BEFORE_S = 900, 300  # STS's shortest: 15 min
    env = _boot_env(fleet, a, fleet["token_a"], AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S="600")
    boot_key = env["AWS_ACCESS_KEY_ID"]
    settings.S3_CREDENTIALS_DURATION_S = 3600  # what every later vend uses

    # Outside the refresh window the boot credentials serve: the control plane is not asked.
    early = _store(env, a)
    early.put("checkpoints/1", b"one")
    assert early.get("checkpoints/1") == b"one"
    assert _renewals(a) == 0

    # The same credentials, now inside the window (1000 s > the 900 s they have left): the first call renews.
    env["AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S"] = "1000"
    store = _store(env, a)
    store.put("checkpoints/2", b"two")
    assert _renewals(a) == 1

    # The boot session ends at the peer; a client still holding it is refused, the instance's is not.
    _expire_at_the_peer(boot_key)
    stale = boto3.client("s3", endpoint_url=fleet["s3_url"], region_name="us-east-1", aws_access_key_id=boot_key,
                         aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], aws_session_token=env["AWS_SESSION_TOKEN"])
    with pytest.raises(ClientError, match="InvalidAccessKeyId"):
        stale.get_object(Bucket=settings.S3_BUCKET, Key=f"tenants/{a.pk}/checkpoints/1")
    with pytest.raises(ClientError, match="InvalidAccessKeyId"):
        early.get("checkpoints/1")  # the first client never entered its window: it still has the boot session
    assert store.get("checkpoints/1") == b"one"
    store.put("checkpoints/3", b"three")
    assert store.list("checkpoints/") == ["checkpoints/1", "checkpoints/2", "checkpoints/3"]
    store.delete("checkpoints/3")
    assert not store.exists("checkpoints/3")
    assert _renewals(a) == 1  # the renewed session has an hour left: no renewal at every call

    # The renewed session is the tenant's own: its session name and its policy name A's prefix only.
    renewed = [r for r in _sessions() if r.session_name == f"tenant-{a.pk}" and r.access_key_id != boot_key]
    assert renewed
    policy = json.dumps(json.loads(renewed[-1].policy))
    assert f"tenants/{a.pk}/" in policy and f"tenants/{b.pk}/" not in policy
    row = AuditLog.objects.get(action="objectstore.credentials_renew", tenant=a)
    assert row.actor_kind == "instance" and row.data["prefix"] == f"tenants/{a.pk}/"

    # (d) nothing secret in any log line, nor in the audit row.
    secrets = [*_secrets_of_every_session(), fleet["token_a"], settings.S3_SECRET_ACCESS_KEY]
    assert "renewed" in logs.text
    assert not [s for s in secrets if s in logs.text]
    assert not [s for s in secrets if s in json.dumps(row.data)]



def test_a_pod_restarted_with_expired_credentials_in_its_secret_renews_on_first_use(fleet, settings):
    a = fleet["a"]
    env = _boot_env(fleet, a, fleet["token_a"])
    _expire_at_the_peer(env["AWS_ACCESS_KEY_ID"])
    env["AWS_CREDENTIAL_EXPIRATION"] = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    store = _store(env, a)
    store.put("after-restart", b"ok")
    assert store.get("after-restart") == b"ok"
    assert _renewals(a) == 1

def test_when_the_control_plane_cannot_renew(fleet, settings, logs):
    a = fleet["a"]
    settings.S3_CREDENTIALS_DURATION_S, settings.S3_CREDENTIALS_RENEW_BEFORE_S = 900, 300
    # Inside the advisory window with the control plane unreachable: the current credentials still serve.
    env = _boot_env(fleet, a, fleet["token_a"], AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S="1000",
                    AGENT_CONTROL_PLANE_URL="http://127.0.0.1:9")
    store = _store(env, a)
    store.put("still-works", b"yes")
    assert store.get("still-works") == b"yes"
    assert "advisory refresh period" in logs.text

    # Inside the mandatory window (the credentials say they end in 2 minutes) with the instance's tenant gone:
    # the control plane refuses the token, and the S3 call fails instead of running on expiring credentials.
    env = _boot_env(fleet, a, fleet["token_a"])
    env["AWS_CREDENTIAL_EXPIRATION"] = (datetime.now(UTC) + timedelta(minutes=2)).isoformat()
    a.status = "deleted"
    a.save(update_fields=["status"])
    with pytest.raises(CredentialUnavailable, match="control plane said 401") as refused:
        _store(env, a).put("after-expiry", b"no")
    secrets = [*_secrets_of_every_session(), fleet["token_a"], settings.S3_SECRET_ACCESS_KEY]
    assert not [s for s in secrets if s in str(refused.value) or s in logs.text]
    assert _renewals(a) == 0


# --- (c) one tenant's token never obtains another's credentials ------------------------------------------------


def _get(fleet: dict[str, Any], tenant_id: str, token: str) -> requests.Response:
    return requests.get(f"{fleet['cp_url']}/internal/v1/s3-credentials/{tenant_id}",
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _assert_problem(resp: requests.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/problem+json")
    body: dict[str, Any] = resp.json()
    assert body["status"] == status
    for field in ("access_key_id", "secret_access_key", "session_token"):
        assert field not in resp.text
    return body


def test_a_token_for_tenant_a_cannot_obtain_tenant_b_credentials(fleet, settings, make_token, operator, logs):
    a, b = fleet["a"], fleet["b"]
    sessions = len(_sessions())
    for tenant_id, token in ((str(b.pk), fleet["token_a"]), (str(a.pk), fleet["token_b"]),
                             (str(uuid.uuid4()), fleet["token_a"]), ("not-a-tenant-id", fleet["token_a"])):
        body = _assert_problem(_get(fleet, tenant_id, token), 404)
        assert body["detail"] == "no S3 credentials for that tenant"  # the same answer, real tenant or not
    assert len(_sessions()) == sessions  # nothing was vended for any of them
    events = AuditLog.objects.filter(action="security.cross_tenant_attempt", data__resource="s3-credentials")
    assert {(e.tenant_id, e.data["requested_tenant_id"]) for e in events} >= {(a.pk, str(b.pk)), (b.pk, str(a.pk))}
    with pytest.raises(CredentialUnavailable, match="control plane said 404"):
        ControlPlaneS3Credentials(fleet["cp_url"], fleet["token_a"], str(b.pk), f"tenants/{b.pk}/")()
    # An answer for another prefix than the instance's own is refused by the instance too.
    with pytest.raises(CredentialUnavailable, match="another prefix"):
        ControlPlaneS3Credentials(fleet["cp_url"], fleet["token_a"], str(a.pk), f"tenants/{b.pk}/")()

    # No token, a wrong one, an operator's: 401 before anything is looked up.
    for header in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {make_token(operator)}"}):
        resp = requests.get(f"{fleet['cp_url']}/internal/v1/s3-credentials/{a.pk}", headers=header, timeout=30)
        _assert_problem(resp, 401)

    # A's own: fresh credentials for A's prefix, never cached.
    own = _get(fleet, str(a.pk), fleet["token_a"])
    assert own.status_code == 200 and "no-store" in own.headers["Cache-Control"]
    assert own.json()["prefix"] == f"tenants/{a.pk}/" and own.json()["bucket"] == settings.S3_BUCKET
    session = next(r for r in _sessions() if r.access_key_id == own.json()["access_key_id"])
    assert session.session_name == f"tenant-{a.pk}" and f"tenants/{b.pk}/" not in session.policy

    # (d) a refusal at the vend (a 12 h setting) is a problem body naming the setting, with no secret in it.
    settings.S3_CREDENTIALS_DURATION_S = 43200
    body = _assert_problem(_get(fleet, str(a.pk), fleet["token_a"]), 502)
    assert "S3_ROLE_SESSION_NOT_CHAINED" in body["detail"]
    secrets = [*_secrets_of_every_session(), fleet["token_a"], fleet["token_b"], settings.S3_SECRET_ACCESS_KEY]
    assert not [s for s in secrets if s in json.dumps(body) or s in logs.text]
