"""Issue 31: ``make demo``'s flow (onboard three customers, the drill, talk) from a fresh var directory on a machine
with both cores saturated: every run ends "Exactly once: yes", its SIGKILL lands inside a step (read from the
victim's step events), the exit is noticed within a second and that step starts again within
``RECOVERY_BOUND_S`` of the kill, detection included (the 3 s goal: ``DEMO_DRILL_GOAL_S=3``, below).

Each run is ``scripts/demo.py`` as ``make demo`` runs it (a subprocess: migrate, web, worker, beat and the peers
started under a new ``CONTROLPLANE_VAR_DIR``, onboarding over the REST API, the drill, the conversation), against
this session's test database and broker as CI gives them, then ``scripts/services.py stop``. The load is 2 x cores
shell busy loops, checked to keep every core busy (measured machine-wide: on a machine other work already loads,
test_saturated_machine's check of the loops' own share fails although the cores are full). ``DEMO_DRILL_RUNS``
sets the number of runs (1 by default, to keep the suite under 40 minutes; one test each;
``DEMO_DRILL_RUNS=10`` for the figures in docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta

import psutil
import pytest
from django.conf import settings

from controlplane.periodic import periodic_jobs_sync
from provisioning.models import RecoveryEvent
from tenants.models import AuditLog, Tenant
from tests.provisioning.test_recovery import _events

from .conftest import BASE_DIR, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = int(os.environ.get("DEMO_DRILL_RUNS", "1"))
# The goal is 3 s from kill to resumed step: `DEMO_DRILL_RUNS=10` measures it (docs/benchmarks.md). A wall
# clock is not asserted against a goal in CI, where other work shares the cores: CI asserts what tells the honest
# drill apart, an exit noticed within a second (the exit notice or watcher; the heartbeat sweep took 7 s) and a
# resume well before a sweep-driven one (8.7 s). DEMO_DRILL_GOAL_S=3 asserts the goal itself.
DETECTED_WITHIN_S = 1.0
RECOVERY_BOUND_S = float(os.environ.get("DEMO_DRILL_GOAL_S", "6.0"))
DEMO_TIMEOUT_S = 900
PEER_OFFSETS = (25, 26, 27, 28, 29)
BUSY_LOOPS = 2 * (os.cpu_count() or 2)


@pytest.fixture
def busy_cores() -> Iterator[list[psutil.Process]]:
    """`while :; do :; done` loops, more than cores, checked to keep every core at least 90 % busy."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(BUSY_LOOPS)]
    try:
        per_core = psutil.cpu_percent(interval=2, percpu=True)
        assert min(per_core) >= 90, f"the cores are not saturated: {per_core} % busy"
        yield [psutil.Process(p.pid) for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _free_web_port(first: int) -> int:
    """A web port whose peers' ports (PORT+25..+29, as scripts/services.py puts them) are free too."""
    for port in range(first, first + 2000, 7):
        try:
            for p in (port, *(port + o for o in PEER_OFFSETS)):
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise AssertionError("no free port range for the demo")


def _demo_env(var: str, port: int, run: int) -> dict[str, str]:
    """The session's database, broker and name prefix (so its clean-up finds the roles and users), and the rest as a
    first `make demo` has it: its own var directory (volumes, object store, logs, secrets), port and queue, and the
    product's defaults (the exit notice on; the suite turns it off for its own workers)."""
    env = subprocess_env(CONTROLPLANE_VAR_DIR=var, DEMO_PORT=str(port), LOCAL_EXIT_NOTICE="true",
                         CELERY_TASK_DEFAULT_QUEUE=f"{settings.CELERY_TASK_DEFAULT_QUEUE}-drill{run}",
                         COLUMNS="200")  # the demo's lines unwrapped, as read below
    for key in ("LOCAL_VOLUME_ROOT", "LOCAL_OBJECTSTORE_ROOT", "CELERY_FILESYSTEM_BROKER_DIR"):
        env.pop(key, None)
    return env


def _interrupted_and_resumed(events: list[tuple[str, str, datetime]], killed_at: datetime
                             ) -> tuple[str, datetime] | None:
    """The step the kill cut short (its last event before the kill a 'start', its next one a 'start' again) and
    when it started again; None if no step was running at the kill."""
    for step in dict.fromkeys(s for s, _, _ in events):
        mine = [(event, at) for s, event, at in events if s == step]
        before = [i for i, (_, at) in enumerate(mine) if at < killed_at]
        if before and mine[before[-1]][0] == "start":
            after = mine[before[-1] + 1:]
            return (step, after[0][1]) if after and after[0][0] == "start" else None
    return None


def _s(at: datetime | None, since: datetime) -> str:
    return f"{(at - since).total_seconds():.2f}" if at else "?"


@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)
@pytest.mark.parametrize("run", range(RUNS))
def test_the_demo_kills_mid_step_and_ends_exactly_once_on_a_saturated_machine(run, tmp_path, busy_cores):
    # The flush between tests emits post_migrate, which writes the periodic jobs again; sync once more in case
    # a test before this one changed them (the recovery sweep among them): a fresh database has them as declared.
    periodic_jobs_sync()
    var = tmp_path / "var"
    port = _free_web_port(21000 + 100 * (run % 10))
    env = _demo_env(str(var), port, run)
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        demo = subprocess.run([sys.executable, "scripts/demo.py"], cwd=BASE_DIR, env=env, capture_output=True,
                              text=True, timeout=DEMO_TIMEOUT_S, check=False)
        took = time.monotonic() - started
        out = demo.stdout
        logs = {name: (var / "log" / f"{name}.log").read_text(errors="replace")[-3000:]
                for name in ("worker", "web") if (var / "log" / f"{name}.log").exists()}
        assert demo.returncode == 0, (out[-6000:], demo.stderr[-3000:], logs)
        assert "Exactly once: yes" in out and "Killed mid-step: yes" in out, out[-4000:]
        # The support agent called the CRM's MCP tool (counted at that server, as the demo prints it).
        assert "MCP tool used: yes" in out, out[-4000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 26}/stats", timeout=10) as resp:  # noqa: S310
            charges = json.loads(resp.read())["charges_by_key"]
    finally:
        subprocess.run([sys.executable, "scripts/services.py", "stop"], cwd=BASE_DIR, env=env, capture_output=True,
                       timeout=180, check=False)
    assert all(p.is_running() for p in busy_cores)  # the load lasted the whole run

    # From the victim's step events, not from what the demo printed: the kill landed inside a step.
    victim = Tenant.objects.get(operator__slug="demo-ops", slug="acme-corp")
    kill = AuditLog.objects.get(tenant=victim, action="instance.kill")  # written right after the SIGKILL
    task = AuditLog.objects.filter(tenant=victim, action="instance.submit_task").latest("id").data["task"]
    events = _events(victim, f"SELECT step, event, at FROM {{s}}.step_events WHERE task_id = '{task}' ORDER BY id")
    cut = _interrupted_and_resumed(events, kill.created_at)
    assert cut is not None, (kill.created_at, events)
    step, resumed_at = cut
    recovery_s = (resumed_at - kill.created_at).total_seconds()
    printed = re.search(r"time to recover: ([\d.]+) s", out)
    assert printed, out[-3000:]
    # Every step done exactly once in the end; the cut one started twice.
    done = [s for s, event, _ in events if event == "done"]
    assert len(done) == len(set(done)) == 7 and sum(1 for s, e, _ in events if e == "start" and s == step) == 2
    recovery = RecoveryEvent.objects.get(tenant=victim, detected_at__gte=kill.created_at - timedelta(seconds=1))
    assert recovery.outcome == "succeeded", recovery.detail
    # Exactly once at the peers, per tenant: one email whose subject names the task, one charge per payment key.
    sink = [json.loads(line) for line in (var / "log" / "smtp-sink.jsonl").read_text().splitlines()]
    for audit in AuditLog.objects.filter(action="instance.submit_task"):
        if audit.data.get("kind") == "calendar":  # the connected-account task: no mail, no charge
            continue
        sent = [m for m in sink if m["subject"] == f"Report {audit.data['task']}"]
        keys = [r[0] for r in _events(audit.tenant, "SELECT idem_key FROM {s}.effects WHERE effect = 'payment' AND "
                                                    f"task_id = '{audit.data['task']}'")]
        assert len(sent) == 1 and len(keys) == 1 and charges.get(keys[0]) == 1, (audit.tenant.slug, sent, keys)
    into = re.search(r"\(([\d.]+) s after its start event\)", out)
    print(f"\ndrill run {run + 1}/{RUNS}: demo {took:.0f} s (load average {load:.1f} before the spinners); "
          f"SIGKILL {into.group(1) if into else '?'} s into step '{step}', resumed {recovery_s:.2f} s after it "
          f"(demo: {printed.group(1)} s), "
          f"recovery detected +{_s(recovery.detected_at, kill.created_at)}, old host stopped "
          f"+{_s(recovery.stopped_at, kill.created_at)}, new host resumed +{_s(recovery.resumed_at, kill.created_at)} "
          f"s: {recovery.detail}")
    assert (recovery.detected_at - kill.created_at).total_seconds() <= DETECTED_WITHIN_S, recovery.detail
    assert recovery_s <= RECOVERY_BOUND_S and float(printed.group(1)) <= RECOVERY_BOUND_S, (recovery_s, recovery.detail)
