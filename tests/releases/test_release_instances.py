"""Issue 14, part 2: an instance runs its operator's uploaded release, and only that release.

Real wheels (``make_wheel``), registered through the real ``release_create`` (pip install, the sandboxed probe),
then real ``agent-host`` processes started by the local driver for a tenant provisioned by the real onboarding
steps, on the machine's PostgreSQL. Where this machine can sandbox (root and bubblewrap: the suite's machine),
the instances run in their sandboxes, and the release's install directory, which lives under the control
plane's hidden ``var/``, is bound back into the sandbox read-only; nothing else of ``var/`` is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from controlplane.errors import ProvisioningError
from provisioning.drivers.base import TenantSpec
from provisioning.drivers.local_process import LocalProcessDriver, instance_command, live_host_pid, published_port
from provisioning.drivers.local_sandbox import sandbox_support
from provisioning.drivers.pg_admin import admin_conninfo
from provisioning.fleet.instances import instance_submit_task
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from provisioning.workflows.steps import StepContext, step_database, step_objectstore, step_vault, step_volume
from releases.assignments import assignment_switch
from releases.models import AgentRelease
from releases.services import release_create, release_env_dir
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import wait_for
from tests.releases.test_releases_upload import make_wheel

pytestmark = pytest.mark.django_db

GREETER = '''
from agent_runtime.sdk import Agent

agent = Agent("greeter", description="greeter {version}")


@agent.step
def greet(ctx):
    return {{"greeted": ctx.params.get("name", "you"), "version": {version!r}, "file": __file__}}
'''
ENTRY_POINTS = "[agent_runtime.agents]\ngreeter = greeter_agent:agent\n"

# Runs as the instance does (its uid, its sandbox, its environment, release included); one JSON line out.
LOOK_AROUND = r'''
import errno, json, os, sys
t = json.loads(sys.argv[1])
out = {}

def attempt(name, fn):
    try:
        out[name] = "ok: " + str(fn())[:200]
    except OSError as exc:
        out[name] = f"{type(exc).__name__}:{errno.errorcode.get(exc.errno, exc.errno)}"

attempt("uid", os.getuid)
attempt("release_env", lambda: os.environ["AGENT_RELEASE_PATH"])
attempt("read_own", lambda: open(os.path.join(t["own"], "greeter_agent", "__init__.py")).read())
attempt("list_own", lambda: sorted(os.listdir(t["own"])))
attempt("write_new_in_own", lambda: open(os.path.join(t["own"], "planted.py"), "w").write("x = 1\n"))
attempt("append_own", lambda: open(os.path.join(t["own"], "greeter_agent", "__init__.py"), "a").write("#"))
attempt("mkdir_in_own", lambda: os.mkdir(os.path.join(t["own"], "greeter_agent", "more")))
attempt("other_release", lambda: os.listdir(t["other"]))
attempt("other_release_file", lambda: open(os.path.join(t["other"], "greeter_agent", "__init__.py")).read())
attempt("wheels", lambda: os.listdir(t["wheels"]))
attempt("secrets_dir", lambda: os.listdir(t["secrets"]))
attempt("import_release", lambda: __import__("greeter_agent").__file__)
print(json.dumps(out))
'''


@pytest.fixture
def releases_root(settings) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """Releases where the product keeps them, under the control plane's ``var/`` (hidden from instances)."""
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    settings.RUNTIME_STOP_GRACE_S = 15
    (Path(settings.VAR_DIR) / "secrets").mkdir(mode=0o700, parents=True, exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tenant(operator, releases_root) -> Iterator[Tenant]:  # type: ignore[no-untyped-def]
    """A customer with its database, volume, object prefix and keys provisioned by the onboarding steps
    themselves; its instance is started by each test with the spec it needs, and stopped afterwards."""
    created, _ = tenant_onboard(operator=operator, slug=f"rel-{secrets.token_hex(3)}", name="Release customer",
                                actor=SYSTEM, allow_no_release=True)
    ctx = StepContext(created)
    for step in (step_database, step_volume, step_objectstore, step_vault):
        step(ctx)
    yield created
    LocalProcessDriver().stop(_spec(created), grace_s=10)


def _spec(tenant: Tenant, release: dict[str, str] | None = None) -> TenantSpec:
    spec = tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))
    return dataclasses.replace(spec, release=release or {})


def _register(operator: Any, version: str) -> dict[str, str]:
    """A greeter release uploaded and validated for real; what the spec names it by."""
    filename, data = make_wheel("greeter-agent", version, module=GREETER.format(version=version),
                                entry_points=ENTRY_POINTS)
    release = release_create(operator=operator, filename=filename, data=data, actor=SYSTEM)
    env = release_env_dir(release.digest)
    assert (env / "greeter_agent" / "__init__.py").is_file()
    return {"version": release.version, "digest": release.digest, "env": str(env)}


def _host_dir(spec: TenantSpec) -> Path:
    return Path(spec.resources["volume"].details["path"]) / ".host"


def _readyz(spec: TenantSpec) -> tuple[int, dict[str, Any]]:
    port = published_port(_host_dir(spec), spec.tenant_id)
    assert port is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _query(tenant: Tenant, text: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        return conn.execute(sql.SQL(text).format(s=sql.Identifier(tenant.resource_name)), args).fetchall()


def _events(tenant: Tenant) -> list[tuple[str, dict[str, Any]]]:
    return [(k, d) for k, d in _query(tenant, "SELECT kind, detail FROM {s}.host_events ORDER BY id")]


def _run_task(tenant: Tenant, name: str) -> dict[str, Any]:
    task_id = instance_submit_task(tenant=tenant, kind="greeter", params={"name": name}, actor=SYSTEM)

    def finished() -> str | None:
        status = _query(tenant, "SELECT status FROM {s}.tasks WHERE id = %s", task_id)[0][0]
        return status if status in ("done", "failed", "blocked") else None

    assert wait_for(finished, timeout=60, what="the task finished") == "done"
    rows = _query(tenant, "SELECT value FROM {s}.case_entries WHERE task_id = %s AND kind = 'done' AND key = 'greet'",
                  task_id)
    assert len(rows) == 1, rows
    return dict(rows[0][0])


def test_an_instance_loads_exactly_its_release_and_runs_its_task(operator, tenant):  # type: ignore[no-untyped-def]
    # The runtime's own environment has agents (the examples): the release's instance must not load them.
    built_in = {ep.name for ep in importlib.metadata.entry_points(group="agent_runtime.agents")}
    assert built_in and "greeter" not in built_in
    release = _register(operator, "1.0.0")
    spec = _spec(tenant, release)
    ref = LocalProcessDriver().ensure(spec)
    assert (ref.details["release_version"], ref.details["release_digest"]) == ("1.0.0", release["digest"])
    assert ref.details["isolation"] == ("sandboxed" if sandbox_support()[0] else "degraded")
    env = psutil.Process(ref.details["pid"]).environ()
    assert (env["AGENT_RELEASE_PATH"], env["AGENT_RELEASE_VERSION"], env["AGENT_RELEASE_DIGEST"]) == (
        release["env"], "1.0.0", release["digest"])
    assert env["PYTHONPATH"].split(":") == [str(settings.BASE_DIR), release["env"]]

    code, body = _readyz(spec)
    assert code == 200, body
    assert [a["kind"] for a in body["agents"]] == ["greeter"], body["agents"]
    assert body["agents"][0]["source"] == "greeter-agent (entry point 'greeter = greeter_agent:agent')"
    assert body["release"] == {"version": "1.0.0", "digest": release["digest"]}
    boots = [d for k, d in _events(tenant) if k == "boot"]
    assert len(boots) == 1 and boots[0]["release"] == {"version": "1.0.0", "digest": release["digest"]}

    result = _run_task(tenant, "Ada")
    assert result == {"greeted": "Ada", "version": "1.0.0",
                      "file": str(Path(release["env"]) / "greeter_agent" / "__init__.py")}


def test_without_a_release_the_instance_runs_the_runtime_agents_as_before(tenant):  # type: ignore[no-untyped-def]
    spec = _spec(tenant)
    ref = LocalProcessDriver().ensure(spec)
    assert (ref.details["release_version"], ref.details["release_digest"]) == ("", "")
    env = psutil.Process(ref.details["pid"]).environ()
    assert not {"AGENT_RELEASE_PATH", "AGENT_RELEASE_VERSION", "AGENT_RELEASE_DIGEST"} & set(env)
    assert env["PYTHONPATH"] == str(settings.BASE_DIR)
    code, body = _readyz(spec)
    assert code == 200 and body["release"] is None
    kinds = {a["kind"] for a in body["agents"]}
    assert "demo" in kinds and "greeter" not in kinds, kinds
    assert [d["release"] for k, d in _events(tenant) if k == "boot"] == [None]


@pytest.mark.skipif(not sandbox_support()[0], reason="the sandbox needs root and bubblewrap")
def test_the_sandbox_shows_its_release_read_only_and_nothing_else_of_var(operator, tenant):  # type: ignore[no-untyped-def]
    own, other = _register(operator, "1.0.0"), _register(operator, "2.0.0")
    spec = _spec(tenant, own)
    secrets_dir = Path(settings.VAR_DIR) / "secrets"
    wheels = Path(settings.LOCAL_OBJECTSTORE_ROOT) / "controlplane" / "releases"  # the stored wheels
    # Seen from outside, every target exists: what the instance cannot see is hidden, not absent.
    assert Path(other["env"], "greeter_agent", "__init__.py").is_file() and secrets_dir.is_dir() and wheels.is_dir()
    targets = {"own": own["env"], "other": other["env"], "wheels": str(wheels), "secrets": str(secrets_dir)}
    argv, env = instance_command(spec, [sys.executable, "-c", LOOK_AROUND, json.dumps(targets)])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["uid"] != "ok: 0", seen
    assert seen["release_env"] == f"ok: {own['env']}"
    assert seen["read_own"].startswith("ok: ") and "greeter 1.0.0" in seen["read_own"], seen
    assert "greeter_agent" in seen["list_own"], seen
    assert seen["import_release"] == f"ok: {own['env']}/greeter_agent/__init__.py", seen
    # Read-only as a mount (EROFS: creating anything), not merely another uid's files. Opening an existing file for
    # writing meets the file's own permission check first (root's 0644: EACCES), before the mount's.
    for name in ("write_new_in_own", "mkdir_in_own"):
        assert seen[name] == "OSError:EROFS", (name, seen[name])
    assert seen["append_own"] == "PermissionError:EACCES", seen
    for name in ("other_release", "other_release_file", "wheels", "secrets_dir"):
        assert seen[name] == "FileNotFoundError:ENOENT", (name, seen[name])
    assert not Path(own["env"], "planted.py").exists()

    # The running host itself: its release mounted read-only, its volume writable, the other release absent.
    ref = LocalProcessDriver().ensure(spec)
    mounts = {line.split()[4]: line.split()[5] for line in
              Path(f"/proc/{ref.details['pid']}/mountinfo").read_text().splitlines()}
    assert mounts[own["env"]].split(",")[0] == "ro", mounts
    assert mounts[spec.resources["volume"].details["path"]].split(",")[0] == "rw", mounts
    assert other["env"] not in mounts and not any(m.startswith(str(secrets_dir)) for m in mounts), mounts


def test_ensure_replaces_a_host_running_another_release_and_reuses_the_same(operator, tenant):  # type: ignore[no-untyped-def]
    driver = LocalProcessDriver()
    first, second = _register(operator, "1.0.0"), _register(operator, "2.0.0")
    assert first["digest"] != second["digest"]
    ref = driver.ensure(_spec(tenant, first))
    assert driver.ensure(_spec(tenant, first)).details["pid"] == ref.details["pid"]  # the same release: reused
    assert [k for k, _ in _events(tenant)] == ["boot"]
    old = psutil.Process(ref.details["pid"])

    replaced = driver.ensure(_spec(tenant, second))
    assert replaced.details["pid"] != ref.details["pid"] and not old.is_running()
    assert (replaced.details["release_version"], replaced.details["release_digest"]) == ("2.0.0", second["digest"])
    assert live_host_pid(_spec(tenant, second)) == replaced.details["pid"]
    events = _events(tenant)
    # A graceful stop (the old host recorded its clean shutdown), then a boot with the new release.
    assert [k for k, _ in events] == ["boot", "clean_shutdown", "boot"], events
    assert [d["release"] for k, d in events if k == "boot"] == [
        {"version": "1.0.0", "digest": first["digest"]}, {"version": "2.0.0", "digest": second["digest"]}]
    assert _run_task(tenant, "Grace")["version"] == "2.0.0"

    # Back to the runtime's own agents is a change of release too.
    plain = driver.ensure(_spec(tenant))
    assert plain.details["pid"] != replaced.details["pid"] and plain.details["release_digest"] == ""
    assert [d["release"] for k, d in _events(tenant) if k == "boot"][-1] is None


def test_the_instance_is_given_the_kinds_its_release_declared_and_refuses_a_mismatch(  # type: ignore[no-untyped-def]
        operator, tenant, settings):
    """Issue 39: the kinds the probe read at upload travel with the release (``TenantSpec.release["kinds"]``) to
    the instance (``AGENT_KINDS``), which imports only those; a record the installed release does not match is
    said at ensure, naming the missing kind, not discovered by the first task."""
    settings.RUNTIME_READY_TIMEOUT_S = 20
    registered = _register(operator, "3.0.0")
    assignment_switch(tenant=tenant, release=AgentRelease.objects.get(digest=registered["digest"]))
    spec = tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))
    assert spec.release["kinds"] == "greeter", spec.release
    ref = LocalProcessDriver().ensure(spec)
    assert psutil.Process(ref.details["pid"]).environ()["AGENT_KINDS"] == "greeter"
    code, body = _readyz(spec)
    assert code == 200 and [a["kind"] for a in body["agents"]] == ["greeter"], body
    LocalProcessDriver().stop(spec, grace_s=10)

    wrong = dataclasses.replace(spec, release={**spec.release, "kinds": "greeter,ghost"})
    with pytest.raises(ProvisioningError, match=r"AGENT_KINDS names \['ghost'\], which no installed package provides"):
        LocalProcessDriver().ensure(wrong)


def test_a_release_that_crashes_on_import_fails_ensure_with_its_cause(tenant, settings):  # type: ignore[no-untyped-def]
    settings.RUNTIME_READY_TIMEOUT_S = 20
    # Installed as the upload path installs (pip --target), without the probe that would have refused it: the code
    # that fails at boot is what matters here, not how it got past validation.
    filename, data = make_wheel("greeter-agent", "0.9.0", module="raise RuntimeError('the vendor SDK needs a licence "
                                "key')\n", entry_points=ENTRY_POINTS)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    env = release_env_dir(digest)
    wheel = Path(settings.RELEASES_ROOT) / filename
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(data)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                    "--disable-pip-version-check", "--target", str(env), str(wheel)], check=True, timeout=120,
                   capture_output=True)
    spec = _spec(tenant, {"version": "0.9.0", "digest": digest, "env": str(env)})
    started = time.monotonic()
    with pytest.raises(ProvisioningError) as raised:
        LocalProcessDriver().ensure(spec)
    message = str(raised.value)
    assert "cannot load its agents" in message, message
    assert f"release 0.9.0 ({digest})" in message, message
    assert "greeter-agent (entry point 'greeter = greeter_agent:agent'): failed to import: RuntimeError: the vendor " \
           "SDK needs a licence key" in message, message
    # Said as soon as the host knew, not after the ready timeout.
    assert time.monotonic() - started < settings.RUNTIME_READY_TIMEOUT_S
    # The host stays up and not ready, saying why (no crash loop), and names the release it was given.
    assert live_host_pid(spec) is not None
    code, body = _readyz(spec)
    assert code == 503 and "vendor SDK needs a licence key" in body["error"]
    assert body["release"] == {"version": "0.9.0", "digest": digest}
    assert [k for k, _ in _events(tenant)] == []  # it never booted


def test_a_release_not_installed_here_is_refused_before_anything_starts(tenant):  # type: ignore[no-untyped-def]
    missing = release_env_dir("sha256:" + "0" * 64)
    spec = _spec(tenant, {"version": "3.0.0", "digest": "sha256:" + "0" * 64, "env": str(missing)})
    with pytest.raises(ProvisioningError, match=r"release 3\.0\.0 \(sha256:0+\) is not installed on this machine"):
        LocalProcessDriver().ensure(spec)
    assert live_host_pid(spec) is None
    with pytest.raises(ProvisioningError, match="needs a version, a sha256: digest and an absolute path"):
        LocalProcessDriver().ensure(_spec(tenant, {"version": "3.0.0", "digest": "abc", "env": "relative/dir"}))
