"""An idle host sleeps (issue 39): no short timers, woken by what concerns it.

A task submitted by another process (``tasks.submit`` notifies the tenant's own channel) is picked up at once
although the worker's own look is far away (poll and heartbeat 10 s): the lease session's LISTEN woke it. And an
idle host is scheduled a few times a second at most: the voluntary context switches of all its threads, counted by
the kernel, stay under a bound that the former timers (main loop and HTTP server every 0.1 s, psycopg's LISTEN-less
worker poll every poll interval) exceeded several times over. Real host process, real PostgreSQL, nothing patched.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent_runtime.db import connect
from agent_runtime.state import tasks

from .conftest import HostRunner, TenantDB
from .test_host import wait_status


def _voluntary_switches(pid: int) -> int:
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def test_a_task_submitted_elsewhere_wakes_an_idle_host_at_once(tenant_db: TenantDB, host_env: dict,
                                                                 hosts: HostRunner) -> None:
    env = dict(host_env, AGENT_APP="tests.runtime.agents:AGENTS", AGENT_POLL_INTERVAL_S="10",
               AGENT_HEARTBEAT_INTERVAL_S="10")
    hosts.start(env)
    hosts.wait_ready(env)
    time.sleep(0.5)  # the worker's first look is done: it sleeps until woken or 10 s from now
    for _ in range(2):  # without the wake-up each has a 1 in 10 chance of falling within a look's reach
        with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
            t0 = time.monotonic()
            tid = tasks.submit(c, "unstorable", {})
        assert wait_status(tenant_db, tid, ("done",), timeout=20) == "done"
        took = time.monotonic() - t0
        assert took < 1.0, f"the idle worker took {took:.2f} s to pick up a notified task"


def test_an_idle_host_is_scheduled_a_few_times_a_second_at_most(tenant_db: TenantDB, host_env: dict,
                                                                 hosts: HostRunner) -> None:
    # The test default poll (0.05 s) would have made the worker alone wake 20 times a second.
    env = dict(host_env, AGENT_APP="tests.runtime.agents:AGENTS", AGENT_HEARTBEAT_INTERVAL_S="2")
    proc = hosts.start(env)
    hosts.wait_ready(env)
    time.sleep(1.0)
    window = 6.0
    before = _voluntary_switches(proc.pid)
    time.sleep(window)
    rate = (_voluntary_switches(proc.pid) - before) / window
    # Left: one look for tasks, one lease renewal, the main thread (each 1 per 2 s,
    # a few switches with their queries). The former timers came to 40/s and more.
    assert rate < 12, f"an idle host woke {rate:.1f} times a second"
    assert hosts.get(env, "/healthz")[0] == 200
