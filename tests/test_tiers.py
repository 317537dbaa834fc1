"""The test tiers select what they say (tests/tiers.py): a renamed fixture or a moved folder must not quietly move
process-starting tests into `make test-fast`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import BASE_DIR, subprocess_env
from .tiers import E2E_FIXTURES, SLOW_S, load_durations


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One collection of the whole suite in a subprocess, as `make test` collects it (every fixture it defines,
    each test's tier markers): collecting is most of this module's time, so it is done once for every question."""
    report = tmp_path_factory.mktemp("tiers") / "report.json"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--tiers-report", str(report), "tests"],
                         cwd=BASE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]
    data: dict[str, Any] = json.loads(report.read_text())
    assert set(data["items"]) == {line for line in out.stdout.splitlines() if "::" in line}  # the report is whole
    return data


def _select(collected: dict[str, Any], keep: Callable[[set[str]], bool], *paths: str) -> set[str]:
    """The tests under ``paths`` that ``-m`` would keep (``keep`` gets a test's tier markers)."""
    return {test for test, marks in collected["items"].items()
            if test.startswith(tuple(f"{p}/" if not p.endswith(".py") else f"{p}::" for p in paths))
            and keep(set(marks))}


def test_every_e2e_fixture_exists_so_renaming_one_cannot_empty_the_tier(collected: dict[str, Any]) -> None:
    defined = set(collected["fixtures"])
    assert E2E_FIXTURES <= defined, sorted(E2E_FIXTURES - defined)


def test_the_fast_tier_leaves_out_browsers_processes_and_recorded_slow_tests(collected: dict[str, Any]) -> None:
    # -m "not slow and not e2e and not browser", -m e2e, -m browser
    fast = _select(collected, lambda m: not m & {"slow", "e2e", "browser"}, "tests/browser",
                   "tests/provisioning/test_recovery.py", "tests/test_tiers.py", "tests/vault/test_vault_crypto.py")
    e2e = _select(collected, lambda m: "e2e" in m, "tests/provisioning/test_recovery.py",
                  "tests/vault/test_vault_crypto.py")
    browser = _select(collected, lambda m: "browser" in m, "tests/browser")
    assert browser and not any(t.startswith("tests/browser/") for t in fast)
    assert any(t.startswith("tests/provisioning/test_recovery.py") for t in e2e)  # onboards with a real worker
    assert not any(t.startswith("tests/provisioning/test_recovery.py") for t in fast)
    assert not any(t.startswith("tests/vault/test_vault_crypto.py") for t in e2e)  # pure crypto: no processes
    slow = {k for k, v in load_durations().items() if v >= SLOW_S}
    assert not slow & fast
    assert any(t.startswith("tests/vault/test_vault_crypto.py") for t in fast)
