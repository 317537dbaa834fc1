"""Every control-plane setting is declared once (controlplane/config_table.py), documented and read from there.

An undeclared environment read, a README out of step with the table and a fault-injection knob honoured without
its test-only switch (or at all in production) each fail here.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from controlplane.config_table import (
    FAULT_INJECTION_SWITCH,
    SETTINGS,
    fault_injection_problems,
    fault_knobs,
    loopback_grant_problem,
    markdown_table,
)
from tests import source_ast
from tests.conftest import BASE_DIR, subprocess_env

# The control plane's packages. scripts/ is left out on purpose: the demo supervisor's own variables (DEMO_PORT,
# KEEP_DB...) configure that script, not the control plane, and it hands the rest on unread. Our apps as
# INSTALLED_APPS names them, so a new app is scanned without anyone remembering to list it here.
PACKAGES = tuple(dict.fromkeys(app.split(".")[0] for app in settings.INSTALLED_APPS
                               if (BASE_DIR / app.split(".")[0]).is_dir()))
# The operating system's and Django's own variables, passed on to child processes: not configuration.
PROCESS_ENVIRONMENT = {"PATH", "LANG", "XDG_RUNTIME_DIR", "DJANGO_SETTINGS_MODULE"}
# django-environ's readers (environ.Env methods that take a variable name).
_ENV_READERS = {"str", "bool", "int", "float", "list", "tuple", "dict", "json", "url", "db_url", "cache_url",
                "email_url", "search_url", "path", "get_value"}


def _is_environ(node: ast.expr) -> bool:
    """``os.environ``, ``env.ENVIRON`` or a mapping parameter called ``environ`` (not ``proc.environ()``)."""
    return ((isinstance(node, ast.Name) and node.id == "environ")
            or (isinstance(node, ast.Attribute) and node.attr in ("environ", "ENVIRON")))


def _first_string(args: list[ast.expr]) -> str | None:
    if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def environment_reads(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(variable, line) for every read of a named environment variable in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                yield node.slice.value, node.lineno
        if not isinstance(node, ast.Call) or (name := _first_string(node.args)) is None:
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "_read":
            yield name, node.lineno
        elif isinstance(func, ast.Attribute) and (
            (isinstance(func.value, ast.Name) and func.value.id == "env" and func.attr in _ENV_READERS)
            or (func.attr in ("get", "setdefault", "pop") and _is_environ(func.value))
            or func.attr == "getenv"
        ):
            yield name, node.lineno


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((BASE_DIR / package).rglob("*.py")):
            if "migrations" not in path.parts and "tests" not in path.parts:
                yield path


def test_every_environment_read_of_the_control_plane_names_a_declared_setting():
    reads = {(name, f"{path.relative_to(BASE_DIR)}:{line}")
             for path in _sources() for name, line in environment_reads(source_ast.parse(path.read_text()))}
    assert len(reads) > 150  # the scan sees settings.py's reads: it is not looking at nothing
    undeclared = sorted((name, where) for name, where in reads
                        if name not in SETTINGS and name not in PROCESS_ENVIRONMENT)
    assert undeclared == [], "declare these in controlplane/config_table.py"


def test_every_declared_setting_is_read_by_settings_py():
    settings_py = (BASE_DIR / "controlplane" / "settings.py").read_text()
    read = {name for name, _ in environment_reads(source_ast.parse(settings_py))}
    assert sorted(set(SETTINGS) - read) == []


def test_no_declared_setting_is_dead():
    """A Django setting of ours that settings.py assigns and nothing reads is configuration that does nothing."""
    from django.conf import global_settings

    settings_tree = source_ast.parse((BASE_DIR / "controlplane" / "settings.py").read_text())
    used = {n.id for n in ast.walk(settings_tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    declarations = {BASE_DIR / "controlplane" / "settings.py", BASE_DIR / "controlplane" / "config_table.py"}
    for path in _sources():
        if path not in declarations:
            used |= set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", path.read_text()))
    for path in (BASE_DIR / "templates").rglob("*.html"):
        used |= set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", path.read_text()))
    assigned = {t.id for n in settings_tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    libraries = set(dir(global_settings))
    ours = {name for name in SETTINGS if name in assigned and name not in libraries
            and not name.startswith(("CELERY_", "CORS_", "SECURE_", "SESSION_", "CSRF_", "EMAIL_"))}
    assert len(ours) > 100
    assert sorted(ours - used) == []


def test_the_scan_finds_each_kind_of_read():
    code = ('import os\nos.environ["A1"]\nos.environ.get("A2")\nos.getenv("A3")\nenv.int("A4", default=1)\n'
            '_read("A5")\nenviron.get("A6")\nproc.environ().get("NOT_OURS")\nenv.str(name)\n')
    assert sorted(name for name, _ in environment_reads(source_ast.parse(code))) == ["A1", "A2", "A3", "A4", "A5", "A6"]


def test_readme_configuration_section_is_the_generated_table():
    readme = (BASE_DIR / "README.md").read_text()
    found = re.search(r"<!-- settings:begin[^>]*-->\n(.*?)<!-- settings:end -->", readme, re.S)
    assert found, "README.md lost its generated settings section markers"
    assert found.group(1) == markdown_table(), "run: python manage.py settings --markdown, paste into README.md"
    for name in SETTINGS:
        assert f"| `{name}` |" in found.group(1)


def test_manage_py_settings_lists_every_setting_and_prints_the_readme_section():
    out = io.StringIO()
    call_command("settings", stdout=out)
    table = out.getvalue()
    for setting in SETTINGS.values():
        assert setting.name in table, setting.name
    assert "never (tests)" in table and "required" in table
    markdown = io.StringIO()
    call_command("settings", "--markdown", stdout=markdown)
    assert markdown.getvalue() == markdown_table()


def test_fault_injection_rules():
    knobs = fault_knobs()
    assert {"PROVISIONING_PAUSE_AFTER_EFFECT_S", "PROVISIONING_PAUSE_STEP", "VAULT_ROTATION_PAUSE_PER_ITEM_S",
            "BRANDING_ROLLOUT_PAUSE_PER_ITEM_S"} <= set(knobs)
    for knob in knobs:
        assert SETTINGS[knob].production.value == "never (tests)"
        alone = fault_injection_problems({knob: "1"}, production=False)
        assert len(alone) == 1 and knob in alone[0] and f"{FAULT_INJECTION_SWITCH}=1" in alone[0]
        assert fault_injection_problems({knob: "1", FAULT_INJECTION_SWITCH: "1"}, production=False) == []
        assert fault_injection_problems({knob: "0.5", FAULT_INJECTION_SWITCH: "1"}, production=True)
    assert fault_injection_problems({FAULT_INJECTION_SWITCH: "true"}, production=True)
    assert fault_injection_problems({FAULT_INJECTION_SWITCH: "1", "PROVISIONING_PAUSE_STEP": ""}, production=True) \
        == [f"{FAULT_INJECTION_SWITCH} is a fault-injection setting for tests, refused in production"]
    assert fault_injection_problems({"PROVISIONING_PAUSE_STEP": ""}, production=False) == []


def _shell(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.django_db
def test_a_process_refuses_a_fault_knob_without_the_switch_and_honours_it_with():
    env = subprocess_env(VAULT_ROTATION_PAUSE_PER_ITEM_S="1.5")
    env.pop(FAULT_INJECTION_SWITCH, None)
    code = "from django.conf import settings; print(settings.VAULT_ROTATION_PAUSE_PER_ITEM_S)"
    refused = _shell(env, code)
    assert refused.returncode != 0
    assert "VAULT_ROTATION_PAUSE_PER_ITEM_S is a fault-injection setting" in refused.stderr, refused.stderr[-2000:]
    allowed = _shell({**env, FAULT_INJECTION_SWITCH: "1"}, code)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert allowed.stdout.strip().splitlines()[-1] == "1.5"


@pytest.mark.django_db
def test_loopback_grants_take_exact_ipv4_loopback_addresses_only():
    """``LOCAL_INSTANCE_LOOPBACK_GRANTS`` opens relays past an instance's network namespace: a name (resolved later,
    it could lead anywhere), a private or public address (the egress proxy's to judge) or a bare port is refused
    when the process starts, not when an instance does."""
    assert loopback_grant_problem("127.0.0.1:8026") == "" and loopback_grant_problem("127.0.0.2:1") == ""
    for bad in ("localhost:8026", "10.0.0.5:80", "169.254.169.254:80", "8.8.8.8:53", "8026", "127.0.0.1:0",
                "127.0.0.1:65536", "127.0.0.1:x", "[::1]:8026"):
        assert loopback_grant_problem(bad), bad
    code = "from django.conf import settings; print(settings.LOCAL_INSTANCE_LOOPBACK_GRANTS)"
    refused = _shell(subprocess_env(LOCAL_INSTANCE_LOOPBACK_GRANTS="127.0.0.1:8026,10.0.0.5:80"), code)
    assert refused.returncode != 0
    assert "LOCAL_INSTANCE_LOOPBACK_GRANTS: '10.0.0.5:80': 10.0.0.5 is not a loopback address" in refused.stderr, \
        refused.stderr[-2000:]
    taken = _shell(subprocess_env(LOCAL_INSTANCE_LOOPBACK_GRANTS="127.0.0.1:8026, 127.0.0.1:8027"), code)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert taken.stdout.strip().splitlines()[-1] == "['127.0.0.1:8026', '127.0.0.1:8027']"
