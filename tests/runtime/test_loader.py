"""Agents come from packages: discovery through real distributions' entry points (dist-info directories on
the path, as pip leaves them), every way a package can be wrong, and what the host does about it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_runtime.errors import AgentLoadError
from agent_runtime.host.config import ENVIRONMENT
from agent_runtime.host.loader import load_agents
from agent_runtime.state import tasks

from .conftest import ROOT, HostRunner, TenantDB
from .test_host import wait_status

GOOD_AGENT = """
from agent_runtime.sdk import Agent

agent = Agent("{kind}")

@agent.step
def hello(ctx):
    return {{"hello": ctx.params.get("name", "world")}}
"""


def make_distribution(site: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """Lay out an installed distribution the way pip does: modules plus `<dist>-1.0.dist-info/`."""
    site.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[agent_runtime.agents]\n{lines}")
    return site


def test_entry_points_of_installed_distributions_are_the_agents(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    site = make_distribution(tmp_path / "site", "acme-agents", {"acme_hello": GOOD_AGENT.format(kind="hello")},
                             {"hello": "acme_hello:agent"})
    monkeypatch.syspath_prepend(str(site))
    loaded = load_agents()
    assert loaded.agents["hello"].kind == "hello"
    assert "acme-agents (entry point 'hello = acme_hello:agent')" in loaded.sources["hello"]
    assert {"demo", "forward"} <= set(loaded.agents)  # the examples distribution is installed too
    only = load_agents(kinds=["hello"])
    assert list(only.agents) == ["hello"]
    with pytest.raises(AgentLoadError, match=r"AGENT_KINDS names \['nope'\], which no installed package"):
        load_agents(kinds=["hello", "nope"])


@pytest.mark.parametrize(("module", "entry", "message"), [
    ("raise RuntimeError('database not configured')\n", "acme_bad:agent",
     r"acme-bad \(entry point 'bad = acme_bad:agent'\): failed to import: RuntimeError: database not configured"),
    ("import does_not_exist_anywhere\n", "acme_bad:agent", r"failed to import: ModuleNotFoundError"),
    ("x = 1\n", "acme_bad:agent", r"acme-bad \(entry point 'bad = acme_bad:agent'\): names nothing"),
    ("x = 1\n", "acme_missing_module:agent", r"names nothing"),
    ("x = 1\n", "acme_bad:x", r"1 is not an agent \(it needs a 'kind' and a 'steps\(params\)' method"),
    ("agents = []\n", "acme_bad:agents", r"declares no agent"),
])
def test_a_broken_package_is_named_with_its_cause(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str,
                                                  entry: str, message: str) -> None:
    unique = f"acme_bad_{tmp_path.name.replace('-', '_')}"  # a fresh module each case (sys.modules caches)
    entry, message = entry.replace("acme_bad", unique), message.replace("acme_bad", unique)
    site = make_distribution(tmp_path / "site", "acme-bad", {unique: module}, {"bad": entry})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(AgentLoadError, match=message):
        load_agents()


def test_two_packages_claiming_one_kind_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "acme-one", {"acme_one": GOOD_AGENT.format(kind="helper")}, {"helper": "acme_one:agent"})
    make_distribution(site, "acme-two", {"acme_two": GOOD_AGENT.format(kind="helper")}, {"helper": "acme_two:agent"})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(AgentLoadError, match=r"two packages claim the agent kind 'helper': acme-one .* and acme-two"):
        load_agents()


def test_a_release_directory_is_the_only_source_of_agents(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An operator's release (AGENT_RELEASE_PATH) runs alone: the runtime environment's agents (the examples'
    `demo`, `forward`) are not loaded beside it, and its modules import from its directory."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the release on the path: undone afterwards
    unique = f"acme_rel_{tmp_path.name.replace('-', '_')}"
    release = make_distribution(tmp_path / "env", "acme-release", {unique: GOOD_AGENT.format(kind="hello"),
                                                                    f"{unique}_bye": GOOD_AGENT.format(kind="bye")},
                                {"hello": f"{unique}:agent", "bye": f"{unique}_bye:agent"})
    assert str(release) not in sys.path
    loaded = load_agents(release_path=release, release="release 1.0 (sha256:abc)")
    assert sorted(loaded.agents) == ["bye", "hello"]
    assert loaded.sources["hello"] == f"acme-release (entry point 'hello = {unique}:agent')"
    assert sys.modules[unique].__file__ == str(release / f"{unique}.py")
    assert list(load_agents(kinds=["hello"], release_path=release).agents) == ["hello"]
    with pytest.raises(AgentLoadError, match=r"AGENT_KINDS names \['demo'\], which no installed package provides "
                                             r"\(installed: \['bye', 'hello'\]\)"):
        load_agents(kinds=["demo"], release_path=release)
    with pytest.raises(AgentLoadError, match="AGENT_APP=x:y and AGENT_RELEASE_PATH=.* are both set"):
        load_agents("x:y", release_path=release)


def test_a_missing_or_empty_release_is_named(tmp_path: Path) -> None:
    name = "release 2.0 (sha256:def)"
    with pytest.raises(AgentLoadError, match=r"^release 2\.0 \(sha256:def\): its install directory .* does not "
                                             r"exist"):
        load_agents(release_path=tmp_path / "nowhere", release=name)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentLoadError, match=r"^release 2\.0 \(sha256:def\): no distribution is installed in"):
        load_agents(release_path=tmp_path / "empty", release=name)
    info = tmp_path / "no-agents" / "acme_plain-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plain\nVersion: 1.0\n")
    with pytest.raises(AgentLoadError, match=r"acme-plain declares no entry point in the group 'agent_runtime"):
        load_agents(release_path=tmp_path / "no-agents", release=name)


def test_agent_app_names_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_agent.py").write_text(GOOD_AGENT.format(kind="mine"))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_agents("my_agent:agent")
    assert list(loaded.agents) == ["mine"] and loaded.sources["mine"] == "AGENT_APP=my_agent:agent"
    with pytest.raises(AgentLoadError, match="has no attribute 'nothing'"):
        load_agents("my_agent:nothing")
    with pytest.raises(AgentLoadError, match="must be 'module:attribute'"):
        load_agents("my_agent")


def test_help_lists_every_variable_the_host_reads() -> None:
    out = subprocess.run([sys.executable, "-m", "agent_runtime.host", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    for name, _default, _meaning in ENVIRONMENT:
        assert name in out.stdout
    assert "agent_runtime.agents" in out.stdout and "usage:" in out.stdout
    # The host reads nothing else: every AGENT_* the config module mentions is in the table.
    import re

    source = (ROOT / "agent_runtime" / "host" / "config.py").read_text()
    read = set(re.findall(r'env(?:\.get)?\(?\[?"(AGENT_[A-Z_]+)"', source)) | set(
        re.findall(r'_(?:req|float)\(env, "(AGENT_[A-Z_]+)"', source))
    assert read and read <= {n for n, _d, _m in ENVIRONMENT}, read - {n for n, _d, _m in ENVIRONMENT}


def test_a_package_that_fails_to_import_leaves_the_host_up_and_not_ready(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner, tmp_path: Path) -> None:
    (tmp_path / "broken_agent.py").write_text("raise ImportError('the vendor SDK is missing')\n")
    env = {**host_env, "AGENT_APP": "broken_agent:agent",
           "PYTHONPATH": f"{tmp_path}:{host_env['PYTHONPATH']}"}
    proc = hosts.start(env)
    port = hosts.port(env)
    assert port
    deadline = time.monotonic() + 15
    code, body = 0, {}
    while time.monotonic() < deadline:
        try:
            code, body = hosts.get(env, "/readyz")
            if body.get("error"):
                break
        except OSError:
            pass
        time.sleep(0.1)
    assert code == 503 and body["ready"] is False
    assert "AGENT_APP=broken_agent:agent: module failed to import: ImportError: the vendor SDK is missing" in body[
        "error"]
    time.sleep(1.0)
    assert proc.p.poll() is None  # no crash loop: it stays up and keeps saying why
    assert hosts.get(env, "/healthz")[0] == 200
    events = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "agent_load_failed" and "vendor SDK is missing" in e.get("error", "")
               for e in events)
    proc.kill(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_a_task_of_a_kind_the_instance_does_not_serve_is_blocked_not_failed(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner) -> None:
    """A later release may bring the kind: the task waits, saying which kinds this instance runs."""
    env = {**host_env, "AGENT_KINDS": "forward"}
    hosts.start(env)
    hosts.wait_ready(env)
    from agent_runtime.db import connect

    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        tid = tasks.submit(c, "demo", {})
        assert wait_status(tenant_db, tid, ("blocked", "failed", "done")) == "blocked"
        row = c.execute("SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (tid,)).fetchone()
    assert row[0] == "unknown_kind" and "this instance runs ['forward'], not 'demo'" in row[1]


# Reports which agent modules its process imported: the host's own sys.modules, seen from inside a real step.
REPORTING_AGENT = """
import sys
from agent_runtime.sdk import Agent

agent = Agent("{kind}")

@agent.step
def modules(ctx):
    return {{"imported": sorted(m for m in sys.modules if m.startswith(("{prefix}", "agent_examples", "langgraph")))}}
"""


def test_agent_kinds_imports_only_the_entry_points_named_after_them(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """Issue 39: an undeclared agent's module is never imported, so it costs an idle instance nothing; an entry
    point named otherwise than its kind is still found, by importing the others only until it is."""
    unique = f"acme_lazy_{tmp_path.name.replace('-', '_')}"
    site = make_distribution(tmp_path / "site", "acme-lazy", {
        f"{unique}_light": GOOD_AGENT.format(kind="light"),
        f"{unique}_heavy": GOOD_AGENT.format(kind="heavy"),
        f"{unique}_odd": GOOD_AGENT.format(kind="oddkind"),
    }, {"light": f"{unique}_light:agent", "heavy": f"{unique}_heavy:agent", "zz-odd": f"{unique}_odd:agent"})
    monkeypatch.syspath_prepend(str(site))
    loaded = load_agents(kinds=["light"])
    assert list(loaded.agents) == ["light"]
    assert f"{unique}_light" in sys.modules
    assert f"{unique}_heavy" not in sys.modules and f"{unique}_odd" not in sys.modules
    # No entry point is named 'oddkind': the others are imported one by one until it turns up (it is the last).
    assert list(load_agents(kinds=["oddkind"]).agents) == ["oddkind"]
    assert f"{unique}_odd" in sys.modules


def test_a_host_given_agent_kinds_imports_only_those_and_blocks_the_others_by_name(
        tenant_db: TenantDB, host_env: dict, hosts: HostRunner, tmp_path: Path) -> None:
    """Issue 39 with a real agent-host: beside the runtime's installed examples, a package with two agents; the
    host serves `light` only. Its task reports the host's sys.modules: neither the other agent's module nor any
    example (LangGraph's included) was imported; a task of the undeclared kind is blocked, naming it."""
    prefix = f"acme_kinds_{tmp_path.name.replace('-', '_')}"
    site = make_distribution(tmp_path / "site", "acme-kinds", {
        f"{prefix}_light": REPORTING_AGENT.format(kind="light", prefix=prefix),
        f"{prefix}_heavy": REPORTING_AGENT.format(kind="heavy", prefix=prefix),
    }, {"light": f"{prefix}_light:agent", "heavy": f"{prefix}_heavy:agent"})
    env = {**host_env, "AGENT_KINDS": "light", "PYTHONPATH": f"{site}:{host_env['PYTHONPATH']}"}
    hosts.start(env)
    body = hosts.wait_ready(env)
    assert [a["kind"] for a in body["agents"]] == ["light"], body
    from agent_runtime.db import connect

    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        light = tasks.submit(c, "light", {})
        heavy = tasks.submit(c, "heavy", {})
        assert wait_status(tenant_db, light, ("blocked", "failed", "done")) == "done"
        assert wait_status(tenant_db, heavy, ("blocked", "failed", "done")) == "blocked"
        done = c.execute("SELECT value FROM case_entries WHERE task_id = %s AND kind = 'done' AND key = 'modules'",
                         (light,)).fetchone()
        row = c.execute("SELECT blocked_reason, blocked_detail FROM tasks WHERE id = %s", (heavy,)).fetchone()
    assert done is not None and done[0]["imported"] == [f"{prefix}_light"], done
    assert row[0] == "unknown_kind" and "this instance runs ['light'], not 'heavy'" in row[1], row
