"""Issue 31: every local instance's exit is noticed in under a second, whoever started it, with no sweep; the
runtime resource names the live process after any start.

Real processes and real SIGKILLs: the instances are started by ``manage.py instance start`` (a command that
exits: nobody is their parent), the watcher runs as ``manage.py watch_instances`` in its own process, the
heartbeat timeout is 120 s and nothing runs the sweep, so only the watcher can have noticed. The first tests
drive the watcher against stand-in processes (no database): not children of anyone here, a sandbox that shows
the tenant's environment before its host does, a pid gone or reused before the watcher looked.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.utils import timezone

from provisioning.choices import RecoveryOutcome
from provisioning.drivers.local_fork import SERVER_MODULE
from provisioning.drivers.local_process import HOST_MODULE, is_tenant_process
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from provisioning.models import AgentInstance, ProvisionedResource, RecoveryEvent
from provisioning.recovery.exit_notice import instance_dead_notice
from provisioning.recovery.local_exit_watch import LocalExitWatcher, WatchTarget
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import BASE_DIR, SESSION_TMP, kill_session_instances, onboard_ready, subprocess_env, wait_for
from tests.provisioning.test_local_host_discovery import fake_host_package  # noqa: F401 - a fixture
from tests.provisioning.test_recovery import WORKER_ENV, _events, _host_pids, _payments, _wait_recovered

# --- the watcher against stand-in processes -------------------------------------------------------------------


def _orphan(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    """Start ``argv`` from a launcher that exits at once: the process is nobody's child here."""
    launcher = ("import subprocess, sys; "
                f"p = subprocess.Popen({argv!r}, env={env!r}, cwd={str(cwd)!r}, start_new_session=True, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=30, check=True)
    return int(done.stdout.strip())


def _fake_sandbox(tenant_id: str, pythonpath: Path) -> tuple[int, int]:
    """(sandbox, host): a process with the tenant's environment running the stand-in host as its child."""
    env = {"PATH": os.environ.get("PATH", ""), "AGENT_TENANT_ID": tenant_id, "PYTHONPATH": str(pythonpath)}
    sandbox = _orphan([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-m', "
                       f"{HOST_MODULE!r}])"], env, pythonpath)
    host = wait_for(lambda: next((c.pid for c in psutil.Process(sandbox).children()
                                  if c.cmdline()[1:3] == ["-m", HOST_MODULE]), None), timeout=20, interval=0.05,
                    what="the stand-in host")
    assert isinstance(host, int)
    return sandbox, host


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def __call__(self, tenant_id: str, *, detail: str, log_fields: object) -> str:
        self.calls.append((tenant_id, detail, time.monotonic()))
        return "recorded"


@pytest.fixture
def watcher_in_thread() -> Iterator[object]:
    started: list[tuple[LocalExitWatcher, threading.Thread]] = []

    def start(**kwargs: object) -> LocalExitWatcher:
        watcher = LocalExitWatcher(**kwargs)  # type: ignore[arg-type]
        thread = threading.Thread(target=watcher.run, daemon=True)
        thread.start()
        started.append((watcher, thread))
        return watcher

    yield start
    for watcher, thread in started:
        watcher.stop()
        thread.join(timeout=15)
        assert not thread.is_alive()


def test_an_orphan_host_is_watched_through_its_sandbox_then_itself_and_its_kill_noticed_at_once(
        fake_host_package: Path, tmp_path: Path, watcher_in_thread) -> None:  # noqa: F811
    tenant_id = str(uuid.uuid4())
    pid_file = tmp_path / "instance.pid"
    sandbox, host = _fake_sandbox(tenant_id, fake_host_package)
    try:
        assert os.getpid() not in (psutil.Process(sandbox).ppid(), psutil.Process(host).ppid())
        pid_file.write_text(str(sandbox))  # what ensure writes right after the spawn
        notice = _Recorder()
        watcher = watcher_in_thread(exclusive=False, refresh_s=0.1, notice=notice, targets=lambda: [
            WatchTarget(tenant_id, (int(pid_file.read_text()),))])
        wait_for(lambda: watcher.watching.get(tenant_id) == sandbox, timeout=5, interval=0.02, what="the sandbox")
        pid_file.write_text(str(host))  # ... and once the host runs
        wait_for(lambda: watcher.watching.get(tenant_id) == host, timeout=5, interval=0.02, what="the host")
        killed = time.monotonic()
        os.kill(host, signal.SIGKILL)
        wait_for(lambda: notice.calls, timeout=5, interval=0.01, what="the notice")
        time.sleep(0.5)  # five more refreshes: the same exit is never told twice
        [(told, detail, at)] = notice.calls
        assert told == tenant_id and f"process {host} exited" in detail and "local exit watcher" in detail
        print(f"\nstand-in host SIGKILLed: noticed {at - killed:.3f} s later")
        assert at - killed < 0.5
    finally:
        for pid in (host, sandbox):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_pid_gone_or_reused_before_the_watcher_looked_is_told_once(watcher_in_thread) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    dead, reused = str(uuid.uuid4()), str(uuid.uuid4())
    notice = _Recorder()
    # os.getpid(): alive, but this test's environment is no tenant's (a pid reused by another program)
    watcher_in_thread(exclusive=False, refresh_s=0.05, verify_grace_s=0.3, notice=notice, targets=lambda: [
        WatchTarget(dead, (gone.pid,)), WatchTarget(reused, (os.getpid(),))])
    wait_for(lambda: len(notice.calls) == 2, timeout=5, interval=0.02, what="both notices")
    time.sleep(0.3)
    told = {tenant: detail for tenant, detail, _ in notice.calls}
    assert len(notice.calls) == 2 and set(told) == {dead, reused}
    assert f"process {gone.pid} was gone when the watcher looked" in told[dead]
    assert f"process {os.getpid()} was gone" in told[reused]


# --- the real thing ---------------------------------------------------------------------------------------

HEARTBEAT_TIMEOUT_S = "120"  # far longer than any test here waits: the sweep never finds anything


@pytest.fixture(params=["exec", "fork"])
def world(request, live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    """A worker starting instances each way (``LOCAL_INSTANCE_LAUNCH``): a forked instance's SIGKILL must be
    noticed and recovered like an exec'd one's."""
    extra = (f"AGENT_HEARTBEAT_INTERVAL_S=0.5,AGENT_SMTP_URL={sinks['smtp']},"
             f"AGENT_PAYMENTS_URL={sinks['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0,AGENT_STEP_TIMEOUT_S=4")
    settings.HEARTBEAT_TIMEOUT_S = float(HEARTBEAT_TIMEOUT_S)
    env = {**WORKER_ENV, "CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": extra,
           "HEARTBEAT_TIMEOUT_S": HEARTBEAT_TIMEOUT_S, "LOCAL_EXIT_NOTICE": "false",
           "LOCAL_INSTANCE_LAUNCH": request.param}
    settings.LOCAL_INSTANCE_LAUNCH = request.param
    yield {"worker": worker_factory(**env), "env": env, "sinks": sinks, "launch": request.param}
    kill_session_instances()


def _manage(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *argv], cwd=BASE_DIR, env=subprocess_env(**env),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _runtime_pid(tenant: Tenant) -> int:
    external_id = ProvisionedResource.objects.get(tenant=tenant, kind="runtime").external_id
    assert external_id.startswith("local-process:"), external_id
    return int(external_id.split(":", 1)[1])


class _WatchCommand:
    def __init__(self, env: dict[str, str]) -> None:
        self.log_path = SESSION_TMP / f"watch-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "manage.py", "watch_instances", "--refresh-s", "1"],
                                     cwd=BASE_DIR, env=subprocess_env(**env), stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def out(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_line(self, text: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert text in self.out(), (text, self.out()[-3000:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.mark.django_db(transaction=True)
def test_an_instance_started_by_manage_py_is_recovered_from_a_sigkill_noticed_within_a_second(operator, world):
    env = world["env"]
    tenant = onboard_ready(operator, "watched")
    instance = AgentInstance.objects.get(tenant=tenant)
    watch = _WatchCommand(env)
    try:
        watch.wait_for_line("watching local instances")
        [onboarded] = _host_pids(tenant)
        watch.wait_for_line(f"tenant {tenant.pk}: watching process {onboarded}")

        # A planned stop is no death. Marked stopped before its SIGTERM: the watcher either drops the instance at
        # its next look (no longer meant to run) or sees the exit first and is told "not meant to run".
        _manage(env, "instance", "stop", str(tenant.pk))
        assert _host_pids(tenant) == []
        deadline = time.monotonic() + 5
        while not any(line in watch.out() for line in (
                f"tenant {tenant.pk}: process {onboarded} exited: not meant to run (stopped",
                f"tenant {tenant.pk}: not meant to run now; process {onboarded} no longer watched")):
            assert time.monotonic() < deadline, watch.out()[-3000:]
            time.sleep(0.05)
        time.sleep(1.0)
        assert "recovery started" not in watch.out()
        assert not RecoveryEvent.objects.filter(tenant=tenant).exists()

        # Started by a command that exits: nobody is its parent; the record names it, not the one stopped.
        started = json.loads(_manage(env, "instance", "start", str(tenant.pk)).strip().splitlines()[-1])
        [pid] = _host_pids(tenant)
        assert started["pid"] == pid != onboarded and _runtime_pid(tenant) == pid
        assert psutil.Process(pid).ppid() != os.getpid()
        watch.wait_for_line(f"tenant {tenant.pk}: watching process {pid}", timeout=5)

        before = _payments(world["sinks"])
        instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.3, "step_sleep_s": 0.5}, actor=SYSTEM)
        wait_for(lambda: len(_events(tenant, "SELECT 1 FROM {s}.step_events WHERE event = 'done'")) >= 2,
                 timeout=60, what="two steps done")
        detected: list[float] = []
        resumed: list[float] = []

        def kill_and_recover(pid: int) -> int:
            """SIGKILL the host; the recovery's event and the new host it started (recorded as the runtime's)."""
            recoveries = RecoveryEvent.objects.filter(tenant=tenant).count()
            killed_at = timezone.now()
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: RecoveryEvent.objects.filter(tenant=tenant).count() > recoveries, timeout=10,
                     interval=0.05, what="the recovery")
            event = _wait_recovered(tenant, timeout=60)
            assert event.outcome == RecoveryOutcome.SUCCEEDED, (event.detail, world["worker"].log()[-2000:])
            assert event.reason == "dead" and event.detail == (f"the instance process {pid} exited; noticed by the "
                                                               "local exit watcher"), event.detail
            detected.append((event.detected_at - killed_at).total_seconds())
            resumed.append((event.resumed_at - killed_at).total_seconds())
            assert detected[-1] < 1.0, detected
            new = _runtime_pid(tenant)  # the recovery's start recorded the new process
            assert new != pid and _host_pids(tenant) == [new]
            assert AgentInstance.objects.get(pk=instance.pk).status == "running"
            watch.wait_for_line(f"tenant {tenant.pk}: watching process {new}", timeout=5)
            return new

        # Mid-task: resumed from its checkpoint, each step and effect once.
        pid = kill_and_recover(pid)
        wait_for(lambda: instance_task_summary(tenant=tenant)["tasks"].get("done") == 1, timeout=60, what="task done")
        done_steps = _events(tenant, "SELECT step, count(*) FROM {s}.step_events WHERE event = 'done' GROUP BY step")
        assert done_steps and all(n == 1 for _, n in done_steps)
        new_charges = {k: v for k, v in _payments(world["sinks"]).items() if k not in before}
        assert list(new_charges.values()) == [1], new_charges
        # Idle, twice more: each host a recovery started is watched in turn.
        for _ in range(2):
            pid = kill_and_recover(pid)
        print(f"\nmanage.py watch_instances: {len(detected)} SIGKILLs detected "
              f"{', '.join(f'{d:.3f}' for d in detected)} s after the kill (p50 {statistics.median(detected):.3f}, "
              f"max {max(detected):.3f}); resumed {', '.join(f'{r:.2f}' for r in resumed)} s after it")
        assert RecoveryEvent.objects.filter(tenant=tenant).count() == 3
    finally:
        code = watch.stop()
    out = watch.out()
    assert code == 0, out[-3000:]
    assert "SIGTERM: stopping" in out and out.rstrip().endswith("stopped"), out[-3000:]


@pytest.mark.django_db(transaction=True)
def test_the_parents_notice_and_the_watcher_start_one_recovery_for_one_exit(operator, world, worker_factory,
                                                                            watcher_in_thread):
    """The worker that onboards is the instance's parent (its exit notice on) and the watcher runs too: one
    SIGKILL, two notices, one recovery. Then eight notices at once for one instance: one recovery."""
    world["worker"].stop()
    worker = worker_factory(**{**world["env"], "LOCAL_EXIT_NOTICE": "true"})
    tenant = onboard_ready(operator, "twice")
    [pid] = _host_pids(tenant)
    if world["launch"] == "exec":
        assert worker.proc.pid in [p.pid for p in psutil.Process(pid).parents()]  # through its sandbox, if any
    else:  # forked: the worker is its sandbox's parent, the fork server the host's (it reaps it)
        assert psutil.Process(pid).parent().cmdline()[1:3] == ["-m", SERVER_MODULE]
        spawned = psutil.Process(worker.proc.pid).children(recursive=True)
        assert any(is_tenant_process(c.pid, str(tenant.pk)) for c in spawned)
    watcher = watcher_in_thread(refresh_s=0.2)
    wait_for(lambda: watcher.watching.get(str(tenant.pk)) == pid, timeout=10, interval=0.05, what="watching")
    os.kill(pid, signal.SIGKILL)
    event = _wait_recovered(tenant, timeout=60)
    assert event.outcome == RecoveryOutcome.SUCCEEDED, (event.detail, worker.log()[-2000:])
    wait_for(lambda: [o for o in watcher.outcomes if o[1] == pid], timeout=5, what="the watcher's verdict")
    [(_, _, verdict, _)] = [o for o in watcher.outcomes if o[1] == pid]
    print(f"\nrecovery started by: {event.detail}; the watcher's verdict: {verdict}")
    assert ("noticed by its parent" in event.detail) != (verdict == "recovery started"), (event.detail, verdict)
    time.sleep(1.0)
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1

    barrier = threading.Barrier(8)
    results: list[str] = []

    def notice() -> None:
        barrier.wait()
        results.append(instance_dead_notice(str(tenant.pk), detail="a test's simultaneous notice", log_fields={},
                                            present=lambda _spec: False))

    threads = [threading.Thread(target=notice) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results.count("recovery started") == 1, results
    assert all(r == "a recovery is already under way" or r.startswith("not meant to run (recovering")
               for r in results if r != "recovery started"), results
    assert _wait_recovered(tenant, timeout=60).outcome == RecoveryOutcome.SUCCEEDED
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 2


@pytest.mark.django_db(transaction=True)
def test_one_watcher_for_the_fleet_and_a_standby_takes_over(watcher_in_thread):
    said: list[str] = []
    first = watcher_in_thread(refresh_s=0.1, progress=lambda m: said.append(f"first: {m}"))
    wait_for(first.holding.is_set, timeout=10, interval=0.02, what="the first watcher")
    second = watcher_in_thread(refresh_s=0.1, progress=lambda m: said.append(f"second: {m}"))
    wait_for(lambda: "second: another local exit watcher holds the lease 'local-exit-watch': standing by" in said,
             timeout=10)
    time.sleep(0.5)
    assert not second.holding.is_set()
    first.stop()
    wait_for(second.holding.is_set, timeout=10, interval=0.02, what="the standby to take over")
    assert not first.holding.is_set()


def test_watch_instances_says_what_it_watches_and_refuses_a_runtime_that_starts_nothing(settings):
    from django.core.management import CommandError, call_command

    from provisioning.management.commands.watch_instances import Command

    help_text = " ".join(Command().create_parser("manage.py", "watch_instances").format_help().split())
    assert "every local agent-host process" in help_text and "agent pods" in help_text
    assert "leader lease in PostgreSQL" in help_text
    settings.PROVISIONING_PROFILE = "local"
    settings.PROVISIONING_RUNTIME_DRIVER = "deferred"
    with pytest.raises(CommandError, match="starts no process to watch"):
        call_command("watch_instances")
