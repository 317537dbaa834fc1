"""Test tiers: which tests are `browser`, `e2e` or `slow`, decided from what a test uses and how long it took.

The suite takes about half an hour; `make test-fast` runs what is left once those three are taken out, in a few
minutes, for a developer to run every few minutes. The tiers are assigned here at collection, not by a decorator
on each test, so a new test lands in the right tier without anyone remembering to mark it:

- ``browser``: it drives Chromium (it lives in ``tests/browser/`` or asks for the ``page`` fixture);
- ``e2e``: it starts real processes of ours (a Celery worker, agent-hosts, the live server an instance calls
  back, the protocol peers), so it pays their start-up and waits on them;
- ``slow``: it took at least ``SLOW_S`` seconds in the run recorded in ``tests/durations.json`` (setup, call and
  teardown together, so a module fixture's cost counts against the test that paid it). ``make test-durations``
  records a new file from a full run; a test the file does not know yet counts as fast until the next recording.

`make test` runs every tier; the markers only select (``-m``), they never skip.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

SLOW_S = 0.5
DURATIONS_FILE = Path(__file__).with_name("durations.json")

# Fixtures that start processes: a Celery worker, agent-hosts, the live server an instance calls back, the
# SMTP/payments peers, PgBouncer, a second PostgreSQL, the Kubernetes emulator.
E2E_FIXTURES = frozenset({
    "worker_factory", "hosts", "live_server", "sinks", "nodedupe", "relay", "dovecot", "chat_peer", "stack",
    "moto_url", "k8s_cluster", "cluster", "kubernetes", "second_server", "scram_server", "tenant_server",
    "pgvector_server", "pgv_server",
})

MARKERS = {
    "browser": "drives Chromium through Playwright (tests/browser/)",
    "e2e": "starts real processes of ours (worker, agent-hosts, live server, protocol peers)",
    "slow": f"took {SLOW_S:g} s or more in the run recorded in tests/durations.json",
}


def register(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each test's setup+call+teardown seconds to PATH (JSON) for the slow tier")
    parser.addoption("--tiers-report", metavar="PATH", default=None,
                     help="after collection, write every fixture name and each test's tier markers to PATH (JSON)")


def assign(items: list[pytest.Item]) -> None:
    """Mark every collected test with the tiers it belongs to."""
    recorded = load_durations()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "browser" in item.path.parts or "page" in fixtures:
            item.add_marker(pytest.mark.browser)
        if fixtures & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        if recorded.get(item.nodeid, 0.0) >= SLOW_S:
            item.add_marker(pytest.mark.slow)


def load_durations() -> dict[str, float]:
    if not DURATIONS_FILE.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(DURATIONS_FILE.read_text()).items()}


class DurationRecorder:
    """Sums each test's phases and writes them when the session ends (``--record-durations``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(self.seconds.items())}, indent=0) + "\n")


def install_recorder(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path:
        config.pluginmanager.register(DurationRecorder(Path(path)), "duration-recorder")


class TiersReport:
    """What one collection saw, for tests/test_tiers.py: every fixture defined anywhere under the collected paths
    (what ``pytest --fixtures`` lists) and each test's tier markers (what ``-m`` selects on). One collection of
    the suite answers all its questions, instead of one subprocess per question."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        fixtures = sorted({d.argname for d in session._fixturemanager._get_all_fixture_defs()})  # as --fixtures
        items = {item.nodeid: sorted({m.name for m in item.iter_markers()} & set(MARKERS)) for item in session.items}
        self.path.write_text(json.dumps({"fixtures": fixtures, "items": items}))


def install_report(config: pytest.Config) -> None:
    path = config.getoption("--tiers-report")
    if path:
        config.pluginmanager.register(TiersReport(Path(path)), "tiers-report")
