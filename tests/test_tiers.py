"""The test tiers select what they say (tests/tiers.py): a renamed fixture or a moved folder must not quietly move
process-starting tests into `make test-fast`."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import BASE_DIR, subprocess_env
from .tiers import E2E_FIXTURES, SLOW_S, load_durations


def _collect(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=BASE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_every_e2e_fixture_exists_so_renaming_one_cannot_empty_the_tier() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=BASE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    defined = set(re.findall(r"^([a-z_][a-z0-9_]*)(?: \[\w+ scope\])?(?: --|$)", out.stdout, re.M))
    assert E2E_FIXTURES <= defined, sorted(E2E_FIXTURES - defined)


def test_the_fast_tier_leaves_out_browsers_processes_and_recorded_slow_tests() -> None:
    fast = _collect("-m", "not slow and not e2e and not browser", "tests/browser", "tests/test_recovery.py",
                    "tests/test_tiers.py", "tests/test_vault_crypto.py")
    e2e = _collect("-m", "e2e", "tests/test_recovery.py", "tests/test_vault_crypto.py")
    browser = _collect("-m", "browser", "tests/browser")
    assert browser and not any(t.startswith("tests/browser/") for t in fast)
    assert any(t.startswith("tests/test_recovery.py") for t in e2e)  # onboards with a real worker
    assert not any(t.startswith("tests/test_recovery.py") for t in fast)
    assert not any(t.startswith("tests/test_vault_crypto.py") for t in e2e)  # pure crypto: no processes
    slow = {k for k, v in load_durations().items() if v >= SLOW_S}
    assert not slow & fast
    assert any(t.startswith("tests/test_vault_crypto.py") for t in fast)
