"""``make bench-smoke`` in CI: every benchmark runs end to end at a tiny size (``bench/run_all.py --smoke``, one
process for all of them, as a user runs it) and prints its ratio line, so a bench that breaks fails the suite
instead of the next person's ``make bench``. The figures are not checked: at this size they mean nothing.

Every bench runs here: the ``dev`` extra that ``make test`` installs brings the anchors' packages too (DBOS for
bench_sdk); a missing one fails its bench, naming the package.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run_all import ALL  # noqa: E402

RUN_TIMEOUT_S = 540  # all of them; about 4 minutes on the 2-core CI machine under load
NEEDS = {"sdk": "dbos"}  # bench -> module of an optional extra it cannot run without

pytestmark = [pytest.mark.timeout(RUN_TIMEOUT_S + 60)]


def _missing(name: str) -> str | None:
    module = NEEDS.get(name)
    return module if module and importlib.util.find_spec(module) is None else None


def _server_env() -> dict[str, str]:
    """CI's server (DATABASE_URL's, its maintenance database): the benches create and drop their own databases
    there. Without DATABASE_URL the benches' default, the machine's PostgreSQL on 127.0.0.1:5432."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgresql://", "postgres://")):
        return {}
    parts = urlsplit(url)
    return {"BENCH_POSTGRES_URL": urlunsplit(parts._replace(path="/postgres"))}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """bench name -> (its outcome in run_all's summary, everything it printed)."""
    runnable = [name for name in ALL if not _missing(name)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    # bench_onboarding at its smallest that still measures both ways and splits the bulk over its two workers.
    env.update(BENCH_SMOKE="1", PYTHONUNBUFFERED="1", BENCH_ONBOARD_N="2", BENCH_BULK_N="2", **_server_env())
    # stderr into stdout: a bench's traceback lands in its own section
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), "--smoke", *runnable], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT_S)
    log = tmp_path_factory.mktemp("bench-smoke") / "run_all.log"
    log.write_text(proc.stdout)
    summary = proc.stdout.rsplit("=== smoke summary:", 1)
    assert len(summary) == 2, f"run_all printed no summary (exit {proc.returncode}); log: {log}\n{proc.stdout[-3000:]}"
    outcomes = dict(re.findall(r"^bench_(\w+): (.+) in \d+ s$", summary[1], re.M))
    sections = dict(zip(*[iter(re.split(r"^=== bench_(\w+) ===$", summary[0], flags=re.M)[1:])] * 2, strict=True))
    print(summary[1])  # the per-bench durations, shown with -s or on failure
    return {name: (outcomes.get(name, "not run"), sections.get(name, "")) for name in runnable}


@pytest.mark.parametrize("name", ALL)
def test_bench_runs_and_prints_its_ratio(name: str, smoke_run: dict[str, tuple[str, str]]) -> None:
    missing = _missing(name)
    assert not missing, f"bench_{name} needs {missing}, which the dev extra installs (pip install -e '.[dev]')"
    outcome, output = smoke_run[name]
    assert outcome == "ok", f"bench_{name}: {outcome}\n{output[-4000:]}"
    assert re.search(rf"^ratio {name}: .+ = (\d+\.\d+x|n/a) ", output, re.M), \
        f"bench_{name} printed no ratio line\n{output[-4000:]}"
