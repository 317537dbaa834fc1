"""docs/sdk.md's tutorial, executed as written: its blocks run in page order in one shell (a file block writes
its file where the page shows it, so a later version of a file is the edit a reader makes), against a real
control plane (live web server, real Celery worker, real instances on an uploaded release), so the page can only
say what works. The reference examples are run in tests/runtime/test_docs_reference.py."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from provisioning.drivers.pg_admin import admin_conninfo
from tenants.models import Tenant

from .conftest import BASE_DIR, kill_session_instances, subprocess_env
from .docblocks import doc_blocks, tutorial_script

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = BASE_DIR / "docs" / "sdk.md"
VENV_BIN = Path(sys.executable).parent
# What the page stores in each customer's vault; the signatures the page prints must be made with these.
SIGNING_SECRETS = {"ada": "ada-signing-secret", "bob": "bob-signing-secret"}


def _shape(line: str) -> str:
    """A printed line with what differs from run to run (task ids, pids, timings) masked."""
    line = re.sub(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\.\.\.)", "ID", line.strip())
    return re.sub(r"\d+(?:\.\d+)?", "N", line)


def _signature(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()[:16]


@pytest.fixture
def tutorial_dir() -> Iterator[Path]:
    """The empty directory the tutorial starts from, outside pytest's base: as root the dev loop's PostgreSQL runs
    as pgserver's own user, which must reach its data directory, and any pytest session that starts meanwhile
    takes group and other access off /tmp/pytest-of-<user>."""
    path = Path(tempfile.mkdtemp(prefix="sdk-tutorial-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def releases_root(settings) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """Where the live server keeps the uploaded release and the worker (and the page's `manage.py instance start`)
    finds it: under the control plane's var/, which the instances' sandboxes hide but for their own release."""
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _tenant_rows(slug: str, query: str) -> list[tuple]:  # type: ignore[type-arg]
    tenant = Tenant.objects.get(slug=slug)
    with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(tenant.resource_name))).fetchall()


def test_the_sdk_tutorial_runs_as_written(live_server, worker_factory, tutorial_dir: Path,  # type: ignore[no-untyped-def]
                                          releases_root: Path) -> None:
    tmp_path = tutorial_dir
    blocks = doc_blocks(PAGE)
    script = tutorial_script(blocks, files_under="hello-agent/")
    assert "cat > 'hello-agent/pyproject.toml'" in script
    (tmp_path / "manage.py").symlink_to(BASE_DIR / "manage.py")  # the tutorial runs from the checkout
    env = subprocess_env(CONTROL_PLANE=live_server.url, CONTROL_PLANE_INTERNAL_URL=live_server.url,
                         RELEASES_ROOT=str(releases_root),
                         PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
                         PIP_NO_BUILD_ISOLATION="false",  # build with the venv's setuptools: no download
                         PYTHONPATH=str(BASE_DIR))  # `agent-host` (the venv's script) runs this checkout's runtime
    worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, RELEASES_ROOT=str(releases_root))
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=400)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        # The dev loop first: the package ran from its source, was killed inside `count` and resumed after `greet`.
        assert "SIGKILL instance pid" in out and "from its checkpoint after step greet" in out, out[:3000]
        assert '"report": {"report": "Hello, Ada!"}' in out, out[:3000]
        assert not list((tmp_path / "hello-agent").rglob("*.whl")), "the dev loop built no wheel"
        # The output the page shows is what ran, but for ids, pids and timings.
        printed = {_shape(line) for line in out.splitlines()}
        for block in (b for b in blocks if b.lang == "text"):
            missing = [line for line in block.body.splitlines() if _shape(line) not in printed]
            assert not missing, f"the page shows output that did not appear: {missing}\n{out[:3000]}"
        # The configured package in the dev loop: AGENT_CONFIG and the credential from the environment.
        assert _signature("not-a-secret", "Bonjour, Ada!") in out, out[:6000]
        # Shipped as a release: both customers ran it, each with its own configuration and its own vault's key.
        assert "ada is ready, bob is ready" in out, out[-4000:]
        for slug, greeting in (("ada", "Bonjour, Ada!"), ("bob", "Hallo, Bob!")):
            assert f'"report": "{greeting}"' in out and _signature(SIGNING_SECRETS[slug], greeting) in out, out[-4000:]
            assert [r[0] for r in _tenant_rows(slug, "SELECT content FROM {s}.messages")] == [greeting]
            boots = _tenant_rows(slug, "SELECT detail->'release'->>'version' FROM {s}.host_events WHERE kind = 'boot'")
            assert boots and all(r[0] == "0.1.0" for r in boots), boots
        assert '"counted": 50' in out and '"counted": 3' in out, out[-4000:]
        assert not any(value in out for value in SIGNING_SECRETS.values()), "a secret reached an answer"
        assert "overrides.language" in out, out[-4000:]  # the refused override named its field
        # What the page claims about Ada's resume, checked in her own schema.
        assert '"tasks": {"done": 1}' in out and '"boots": 2' in out, out[-2000:]
        rows = _tenant_rows("ada", "SELECT step, event FROM {s}.step_events ORDER BY id")
        starts = [step for step, event in rows if event == "start"]
        assert starts.count("greet") == 1 and starts.count("report") == 1
        assert starts.count("count") == 2, rows  # killed inside `count`: it ran again from its start
    finally:
        kill_session_instances()
