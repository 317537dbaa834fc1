"""docs/sdk.md's tutorial, executed as written: its package is written to disk, its bash blocks run in one
shell against a real control plane (live web server, real Celery worker, real instances), so the page can
only say what works. The reference examples are run in tests/runtime/test_docs_reference.py."""

from __future__ import annotations

import os
import re
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
from .docblocks import doc_blocks, write_titled_blocks

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = BASE_DIR / "docs" / "sdk.md"
VENV_BIN = Path(sys.executable).parent


def _shape(line: str) -> str:
    """A printed line with what differs from run to run (task ids, pids, timings) masked."""
    line = re.sub(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\.\.\.)", "ID", line.strip())
    return re.sub(r"\d+(?:\.\d+)?", "N", line)


@pytest.fixture
def tutorial_dir() -> Iterator[Path]:
    """The empty directory the tutorial starts from, outside pytest's base: as root the dev loop's PostgreSQL runs
    as pgserver's own user, which must reach its data directory, and any pytest session that starts meanwhile
    takes group and other access off /tmp/pytest-of-<user>."""
    path = Path(tempfile.mkdtemp(prefix="sdk-tutorial-"))
    path.chmod(0o755)  # the instances run as their own users and import the package installed from here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_sdk_tutorial_runs_as_written(live_server, worker_factory, tutorial_dir: Path) -> None:
    tmp_path = tutorial_dir
    blocks = doc_blocks(PAGE)
    written = write_titled_blocks(blocks, tmp_path)
    assert tmp_path / "hello-agent" / "pyproject.toml" in written
    (tmp_path / "manage.py").symlink_to(BASE_DIR / "manage.py")  # the tutorial runs from the checkout
    script = "\n".join(b.body for b in blocks if b.lang == "bash")
    env = subprocess_env(CONTROL_PLANE=live_server.url, CONTROL_PLANE_INTERNAL_URL=live_server.url,
                         PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
                         PIP_NO_BUILD_ISOLATION="false",  # build with the venv's setuptools: no download
                         PYTHONPATH=str(BASE_DIR))  # `agent-host` (the venv's script) runs this checkout's runtime
    worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url)
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
        # Then the installed package's kind is found.
        assert any(line.startswith("[") and "'hello'" in line for line in done.stdout.splitlines()), out[:3000]
        assert "is ready" in out, out[-2000:]
        assert '"tasks": {"done": 1}' in out and '"boots": 2' in out, out[-2000:]
        # What the tutorial claims about the resume, checked in the tenant's own schema.
        tenant = Tenant.objects.get(slug="ada")
        with psycopg.connect(**admin_conninfo(), autocommit=True) as conn:
            rows = conn.execute(sql.SQL("SELECT step, event FROM {}.step_events ORDER BY id").format(
                sql.Identifier(tenant.resource_name))).fetchall()
            reply = conn.execute(sql.SQL("SELECT content FROM {}.messages").format(
                sql.Identifier(tenant.resource_name))).fetchall()
        starts = [step for step, event in rows if event == "start"]
        assert starts.count("greet") == 1 and starts.count("report") == 1
        assert starts.count("count") == 2, rows  # killed inside `count`: it ran again from its start
        assert [r[0] for r in reply] == ["Hello, Ada!"]
    finally:
        kill_session_instances()
        subprocess.run([str(VENV_BIN / "python"), "-m", "pip", "uninstall", "--quiet", "-y", "hello-agent"],
                       capture_output=True, timeout=120, check=False)
