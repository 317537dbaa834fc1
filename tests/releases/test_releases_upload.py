"""Issue 14, part 1: an operator uploads its agent as a wheel; it is registered only once validated.

Real wheels (built here as the format defines them), a real ``pip install``, and the real probe in its own
process (sandboxed as ``nobody`` where this machine can), through the real API. Every bad upload is refused
with its cause named and leaves nothing behind: no row, no kept file, no install, no scratch directory.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from provisioning.drivers.local_sandbox import sandbox_support
from releases.models import AgentRelease
from releases.services import release_env_dir
from tenants.models import AuditLog
from tests.vault.test_vault_helpers import assert_problem

pytestmark = pytest.mark.django_db

GOOD_MODULE = '''
import os
from agent_runtime.sdk import Agent

_secret = os.path.join({var!r}, "secrets")
agent = Agent("hello", description=f"uid={{os.getuid()}} sees-secrets={{os.path.exists(_secret)}}")


@agent.step
def greet(ctx):
    return {{"greeted": ctx.params.get("name", "you")}}
'''


def make_wheel(name: str = "hello-agent", version: str = "0.2.0", *, module: str | None = None,
               entry_points: str | None = "[agent_runtime.agents]\nhello = hello_agent:agent\n",
               requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A wheel as PEP 427 lays it out (METADATA, WHEEL, entry_points.txt, RECORD with hashes)."""
    pkg = name.replace("-", "_")
    info = f"{pkg}-{version}.dist-info"
    files = {f"{pkg}/__init__.py": (module if module is not None else
                                    GOOD_MODULE.format(var=str(settings.VAR_DIR))).encode()}
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points is not None:
        files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record) + f"\n{info}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return f"{pkg}-{version}-py3-none-any.whl", buf.getvalue()


def upload(api, filename: str, data: bytes, **fields: str):  # type: ignore[no-untyped-def]
    handle = io.BytesIO(data)
    handle.name = filename
    return api.post("/api/v1/releases", data={"file": handle, **fields}, format="multipart")


def _store() -> Path:
    return Path(settings.LOCAL_OBJECTSTORE_ROOT) / "controlplane"


def _left_behind() -> list[str]:
    root = Path(settings.RELEASES_ROOT)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(autouse=True)
def releases_root(tmp_path, settings):  # type: ignore[no-untyped-def]
    settings.RELEASES_ROOT = tmp_path / "releases"
    settings.LOCAL_OBJECTSTORE_ROOT = tmp_path / "objectstore"  # where the wheels go (CONTROLPLANE_OBJECTSTORE=local)
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    (Path(settings.VAR_DIR) / "secrets").mkdir(mode=0o700, parents=True, exist_ok=True)
    return settings.RELEASES_ROOT


def test_a_valid_wheel_is_installed_probed_and_registered(api):
    filename, data = make_wheel()
    created = upload(api, filename, data, sha256=hashlib.sha256(data).hexdigest(), notes="first",
                     default_config=json.dumps({"greeting": "hi"}))
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["version"], body["distribution"], body["digest"]) == (
        "0.2.0", "hello-agent", "sha256:" + hashlib.sha256(data).hexdigest())
    assert list(body["kinds"]) == ["hello"] and body["default_config"] == {"greeting": "hi"}
    env = release_env_dir(body["digest"])
    assert (env / "hello_agent" / "__init__.py").is_file()
    release = AgentRelease.objects.get(pk=body["id"])
    # The wheel is kept in the control plane's object store under its digest; this machine's var/ holds a cache.
    assert release.artifact_key == f"releases/{hashlib.sha256(data).hexdigest()}.whl"
    assert (_store() / release.artifact_key).read_bytes() == data
    assert not [p for p in _left_behind() if p.startswith("tmp-")]
    assert api.get(f"/api/v1/releases/{body['id']}").json()["kinds"] == body["kinds"]
    assert [r["id"] for r in api.get("/api/v1/releases").json()] == [body["id"]]
    audit = AuditLog.objects.get(action="release.create", target_id=body["id"])
    # The operator's code ran in the instances' sandbox as nobody, where this machine can sandbox.
    if sandbox_support()[0]:
        assert (Path(settings.VAR_DIR) / "secrets").is_dir()  # there, for the control plane (made by the fixture)
        assert audit.data["isolation"] == "sandboxed"
        assert body["kinds"]["hello"] == "uid=65534 sees-secrets=False"
    else:
        assert audit.data["isolation"] == "degraded"


@pytest.mark.parametrize(("case", "status", "needle"), [
    ("not a zip", 400, "not a wheel: the file is not a zip archive"),
    ("bad file name", 400, "not a wheel"),
    ("digest mismatch", 400, "digest mismatch"),
    ("fails to import", 400, "failed to import: ModuleNotFoundError"),
    ("syntax error", 400, "failed to import: SyntaxError"),
    ("declares no kind", 400, "declares no entry point in the group 'agent_runtime.agents'"),
    ("not an agent", 400, "is not an agent"),
    ("missing dependency", 400, "definitely-not-installed-dist (not installed)"),
    ("too old dependency", 400, "the runtime has"),
])
def test_bad_uploads_are_refused_with_the_cause_and_leave_nothing(api, case, status, needle):
    filename, data = make_wheel()
    extra: dict[str, str] = {}
    if case == "not a zip":
        data = b"this is not a wheel at all"
    elif case == "bad file name":
        filename = "hello.zip"
    elif case == "digest mismatch":
        extra["sha256"] = "0" * 64
    elif case == "fails to import":
        filename, data = make_wheel(module="import no_such_module_anywhere\n")
    elif case == "syntax error":
        filename, data = make_wheel(module="def broken(:\n")
    elif case == "declares no kind":
        filename, data = make_wheel(entry_points=None)
    elif case == "not an agent":
        filename, data = make_wheel(module="agent = 42\n")
    elif case == "missing dependency":
        filename, data = make_wheel(requires=("definitely-not-installed-dist>=1",))
    elif case == "too old dependency":
        filename, data = make_wheel(requires=("Django>=99",))
    problem = assert_problem(upload(api, filename, data, **extra), status)
    assert needle in problem["detail"], problem
    assert not AgentRelease.objects.exists()
    assert _left_behind() == [] or all(not p.startswith("tmp-") for p in _left_behind())
    envs = Path(settings.RELEASES_ROOT) / "envs"
    assert not envs.exists() or not any(envs.iterdir())
    assert not (Path(settings.RELEASES_ROOT) / "wheels").exists() and not _store().exists()


def test_a_version_is_registered_once_and_markers_for_other_pythons_are_ignored(api):
    filename, data = make_wheel(requires=('tomli>=1; python_version < "3.0"',))
    assert upload(api, filename, data).status_code == 201
    again = assert_problem(upload(api, filename, data), 409)
    assert "already exists" in again["detail"]
    assert AgentRelease.objects.count() == 1


def test_another_operators_release_does_not_exist(api, make_token):
    from rest_framework.test import APIClient

    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    filename, data = make_wheel()
    mine = upload(api, filename, data).json()
    other = APIClient()
    theirs = operator_create(slug="rel-other", name="O", actor=SYSTEM)
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(theirs)}")
    assert_problem(other.get(f"/api/v1/releases/{mine['id']}"), 404)
    assert other.get("/api/v1/releases").json() == []
    assert_problem(other.get("/api/v1/releases/not-a-uuid"), 404)


def test_unknown_fields_and_a_too_large_wheel_are_refused(api, settings):
    filename, data = make_wheel()
    assert "unknown fields: is_admin" in assert_problem(upload(api, filename, data, is_admin="1"), 400)["detail"]
    settings.RELEASE_MAX_WHEEL_BYTES = 100
    problem = assert_problem(upload(api, filename, data), 413)
    assert problem["max_bytes"] == 100
    assert not AgentRelease.objects.exists()


def test_an_import_that_hangs_is_killed_at_the_timeout_and_nothing_keeps_running(api, settings):
    import time

    import psutil

    settings.RELEASE_VALIDATION_TIMEOUT_S = 3
    filename, data = make_wheel(module="import time\ntime.sleep(120)\n")
    problem = assert_problem(upload(api, filename, data), 400)
    assert "took longer than 3 s" in problem["detail"]
    assert not AgentRelease.objects.exists()
    def probes() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
                and "agent_runtime.host.probe" in " ".join(p.info["cmdline"] or [])]

    for _ in range(50):  # SIGKILL is delivered at once; reaping by the kernel may take a moment
        if not probes():
            break
        time.sleep(0.1)
    assert probes() == []


def test_two_operators_uploading_the_same_bytes_share_one_install(api, make_token):
    from rest_framework.test import APIClient

    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    filename, data = make_wheel()
    mine = upload(api, filename, data).json()
    other = APIClient()
    same = operator_create(slug="rel-same", name="S", actor=SYSTEM)
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(same)}")
    theirs = upload(other, filename, data)
    assert theirs.status_code == 201, theirs.content
    assert theirs.json()["digest"] == mine["digest"] and theirs.json()["id"] != mine["id"]
    assert [p.name for p in (Path(settings.RELEASES_ROOT) / "envs").iterdir()] == [mine["digest"][7:]]
    # One object for the same bytes (content-addressed), named by both rows.
    assert [p.name for p in (_store() / "releases").iterdir()] == [mine["digest"][7:] + ".whl"]
    assert {r.artifact_key for r in AgentRelease.objects.all()} == {f"releases/{mine['digest'][7:]}.whl"}
