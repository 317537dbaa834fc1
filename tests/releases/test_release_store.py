"""Issue 40: no release state on one control-plane machine's disk. Wheels live in the object store under their
digest; a machine's ``var/releases`` is a cache, made again from the store on use and wiped at no cost.

Against both shared stores: the local driver (a directory both "machines" see) and the S3 one on moto's S3
server over HTTP. A wheel is uploaded through the real API in this process, then:

- installed by a real Celery worker whose ``CONTROLPLANE_VAR_DIR`` is another, empty directory (a second
  machine) while this process's cache has been wiped: it onboards a customer on that release, and the instance
  runs the release from the worker's own cache; that cache wiped while the worker runs, a restart installs it
  again;
- refused when the stored object was tampered with: a clear error naming the digest, nothing installed.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest
from django.conf import settings

from controlplane.errors import ProvisioningError
from provisioning.drivers.local_process import published_port
from provisioning.fleet.actions import instance_restart_request
from provisioning.models import ProvisionedResource
from provisioning.resources import contributions
from releases.assignments import release_default_set
from releases.models import AgentRelease
from releases.selectors import release_env_dir
from tenants.actors import SYSTEM
from tests.conftest import SESSION_TMP, kill_session_instances, onboard_ready, wait_for
from tests.k8s_fixtures import moto_server
from tests.releases.test_release_instances import ENTRY_POINTS, GREETER
from tests.releases.test_releases_upload import make_wheel, upload

pytestmark = pytest.mark.django_db(transaction=True)

MOTO_KEYS = {"S3_ACCESS_KEY_ID": "cp-test", "S3_SECRET_ACCESS_KEY": "cp-test-secret", "S3_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


class Store:
    """The shared store of one test, seen from outside the product (a directory or a bucket)."""

    def __init__(self, kind: str, env: dict[str, str], root: Path | None = None, s3: Any = None,
                 bucket: str = "") -> None:
        self.kind, self.env, self.root, self.s3, self.bucket = kind, env, root, s3, bucket

    def read(self, key: str) -> bytes:
        if self.s3 is not None:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=f"controlplane/{key}")["Body"].read())
        assert self.root is not None
        return (self.root / "controlplane" / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        if self.s3 is not None:
            self.s3.put_object(Bucket=self.bucket, Key=f"controlplane/{key}", Body=data)
        else:
            assert self.root is not None
            (self.root / "controlplane" / key).write_bytes(data)


@pytest.fixture(params=["local", "s3"])
def store(request, settings, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    """This process is machine 1: its own var/releases cache, the store both machines share."""
    settings.RELEASES_ROOT = tmp_path / "machine-1-releases"
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    (Path(settings.VAR_DIR) / "secrets").mkdir(mode=0o700, parents=True, exist_ok=True)
    if request.param == "local":
        settings.CONTROLPLANE_OBJECTSTORE = "local"
        # LOCAL_OBJECTSTORE_ROOT stays the session's: subprocess_env hands it to every worker (a shared mount).
        return Store("local", {"CONTROLPLANE_OBJECTSTORE": "local"}, root=Path(settings.LOCAL_OBJECTSTORE_ROOT))
    url = request.getfixturevalue("moto_url")
    bucket = f"cp-{secrets.token_hex(6)}"
    settings.CONTROLPLANE_OBJECTSTORE = "s3"
    settings.S3_BUCKET, settings.S3_ENDPOINT_URL, settings.S3_CREATE_BUCKET = bucket, url, True
    for name, value in MOTO_KEYS.items():
        setattr(settings, name, value)
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="cp-test",
                      aws_secret_access_key="cp-test-secret")
    env = {"CONTROLPLANE_OBJECTSTORE": "s3", "S3_BUCKET": bucket, "S3_ENDPOINT_URL": url, "S3_CREATE_BUCKET": "true",
           **MOTO_KEYS}
    return Store("s3", env, s3=s3, bucket=bucket)


def _upload_greeter(api: Any, version: str) -> AgentRelease:
    filename, data = make_wheel("greeter-agent", version, module=GREETER.format(version=version),
                                entry_points=ENTRY_POINTS)
    created = upload(api, filename, data)
    assert created.status_code == 201, created.content
    release = AgentRelease.objects.get(pk=created.json()["id"])
    assert release.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    return release


def test_the_wheel_is_kept_in_the_store_by_digest_and_a_wiped_cache_is_made_again(api, store):  # type: ignore[no-untyped-def]
    release = _upload_greeter(api, "1.0.0")
    hexdigest = release.digest[7:]
    assert release.artifact_key == f"releases/{hexdigest}.whl"
    assert hashlib.sha256(store.read(release.artifact_key)).hexdigest() == hexdigest
    uploaded_env = release_env_dir(release.digest)
    assert (uploaded_env / "greeter_agent" / "__init__.py").is_file()

    shutil.rmtree(settings.RELEASES_ROOT)  # var/ wiped: nothing of the release is left on this machine
    assert not uploaded_env.exists()
    contributions.release_install(release.digest)  # what a runtime driver calls when the install is missing
    assert "greeter 1.0.0" in (uploaded_env / "greeter_agent" / "__init__.py").read_text()
    assert not [p for p in Path(settings.RELEASES_ROOT).iterdir() if p.name.startswith("tmp-")]


def test_a_tampered_wheel_in_the_store_is_refused_and_nothing_is_installed(api, store, settings, tmp_path):  # type: ignore[no-untyped-def]
    release = _upload_greeter(api, "1.0.0")
    _, other = make_wheel("greeter-agent", "1.0.0", module=GREETER.format(version="evil"), entry_points=ENTRY_POINTS)
    store.write(release.artifact_key, other)  # same name, other bytes: what a compromised bucket would hold
    settings.RELEASES_ROOT = tmp_path / "machine-2-releases"  # a machine that never installed it
    with pytest.raises(ProvisioningError) as raised:
        contributions.release_install(release.digest)
    message = str(raised.value)
    assert f"the stored wheel of release {release.digest} does not match its digest" in message, message
    assert "sha256:" + hashlib.sha256(other).hexdigest() in message and "refusing to install it" in message
    assert not release_env_dir(release.digest).exists()
    root = Path(settings.RELEASES_ROOT)
    assert not root.exists() or not any(root.iterdir())  # no scratch, no install


def test_a_release_missing_from_the_store_says_where_it_looked(api, store, settings, tmp_path):  # type: ignore[no-untyped-def]
    release = _upload_greeter(api, "1.0.0")
    if store.s3 is not None:
        store.s3.delete_object(Bucket=store.bucket, Key=f"controlplane/{release.artifact_key}")
    else:
        assert store.root is not None
        (store.root / "controlplane" / release.artifact_key).unlink()
    settings.RELEASES_ROOT = tmp_path / "machine-2-releases"
    with pytest.raises(ProvisioningError, match=f"the wheel of release {release.digest} is missing from the object "
                                                "store"):
        contributions.release_install(release.digest)
    assert not release_env_dir(release.digest).exists()


@pytest.fixture
def machine_2(live_server, sinks, worker_factory, store) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A worker with its own, empty var/ (nothing shared with this process but PostgreSQL, Redis and the store).
    Under the session's directory, as the suite's var/ is: instances' sandboxes bind their release from there."""
    var = SESSION_TMP / f"machine-2-var-{secrets.token_hex(4)}"
    extra = f"AGENT_HEARTBEAT_INTERVAL_S=0.5,AGENT_SMTP_URL={sinks['smtp']},AGENT_PAYMENTS_URL={sinks['payments']}"
    env = {**store.env, "CONTROLPLANE_VAR_DIR": str(var), "SECRET_KEY": settings.SECRET_KEY,
           "CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": extra,
           "RELEASE_VALIDATION_TIMEOUT_S": "60", "RUNTIME_READY_TIMEOUT_S": "30", "WORKFLOW_STALL_AFTER_S": "5"}
    yield {"var": var, "start": lambda: worker_factory(**env)}
    kill_session_instances()
    shutil.rmtree(var, ignore_errors=True)


def test_a_release_uploaded_on_one_machine_starts_on_another_with_an_empty_var(api, operator, store, machine_2):  # type: ignore[no-untyped-def]
    release = _upload_greeter(api, "2.0.0")
    release_default_set(operator=operator, release_id=release.pk, actor=SYSTEM)
    shutil.rmtree(settings.RELEASES_ROOT)  # machine 1's cache gone too: only the store holds the wheel
    worker = machine_2["start"]()
    tenant = onboard_ready(operator, f"m2-{secrets.token_hex(3)}", timeout=240)

    env_dir = Path(machine_2["var"]).resolve() / "releases" / "envs" / release.digest[7:]
    assert (env_dir / "greeter_agent" / "__init__.py").is_file(), worker.log()[-3000:]
    assert not Path(settings.RELEASES_ROOT).exists()  # nothing was made on machine 1
    runtime = ProvisionedResource.objects.get(tenant=tenant, kind="runtime")
    assert runtime.details["release_digest"] == release.digest
    proc_env = psutil.Process(runtime.details["pid"]).environ()
    assert (proc_env["AGENT_RELEASE_PATH"], proc_env["AGENT_RELEASE_DIGEST"]) == (str(env_dir), release.digest)
    volume = ProvisionedResource.objects.get(tenant=tenant, kind="volume").details["path"]
    port = published_port(Path(volume) / ".host", str(tenant.pk))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:  # noqa: S310
        body = json.loads(answer.read())
    assert body["release"] == {"version": "2.0.0", "digest": release.digest}
    assert [a["kind"] for a in body["agents"]] == ["greeter"]

    # Machine 2's var/releases wiped while it runs: its next start of the instance installs the release again.
    shutil.rmtree(Path(machine_2["var"]) / "releases")
    instance_restart_request(tenant=tenant, actor=SYSTEM)

    def restarted() -> bool:
        details = ProvisionedResource.objects.get(tenant=tenant, kind="runtime").details
        return details.get("pid") != runtime.details["pid"] and details.get("release_digest") == release.digest

    wait_for(restarted, timeout=180, what="the instance restarted on its release")
    assert (env_dir / "greeter_agent" / "__init__.py").is_file(), worker.log()[-3000:]
