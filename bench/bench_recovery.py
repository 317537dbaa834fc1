"""Recovery benchmark: time to recover after SIGKILL and after a hang (default settings), work lost per crash,
and one sweep's detection time over 10,000 instances (2% stale) against an empty sweep (the two alternating).

Four phases on one tenant, whose real ``agent-host`` runs the demo agent's task, under a real beat running the
sweep every 5 s. The phases take turns in blocks (``BENCH_RECOVERY_ROUNDS`` rounds, 3; the phase that goes first
rotates), so the anchor's samples are spread over the run like the others': each block starts a fresh real Celery
worker with the phase's settings, has it restart the instance (so that worker is the instance's parent, as after
an onboarding), disrupts it, and stops the instance and the worker again:

* SIGKILL with the exit notice on (``LOCAL_EXIT_NOTICE``, the default; provisioning/recovery/exit_notice.py): the worker
  that started the host sees it exit and starts the recovery at once (``BENCH_KILLS``, default 12);
* the anchor, measured in the same run: SIGKILL with ``LOCAL_EXIT_NOTICE=false``, so only the heartbeat timeout
  and the sweep notice it, as before the exit notice existed (``BENCH_SWEEP_KILLS``, default 3);
* a hang: SIGSTOP of the host, which no exit reveals; the heartbeat timeout and the sweep detect it, the recovery
  kills and restarts it (``BENCH_HANGS``, default 3);
* SIGKILL of a pooled instance (Debian's PgBouncer in transaction mode in front of the same database, recorded as
  the default server's pooler; ``BENCH_POOLED_KILLS``, default 5): no session lock to steal, only the fenced lease
  (``AGENT_LEASE_TTL_S``, 15 s by default), which the recovery's stop ends once the dead host is gone.

The tenant database's pooler is recorded on the default server only for the pooled phase's blocks.

Time to recover is from the signal to the step resumed in the new host (``RecoveryEvent.resumed_at``).
External anchor: Temporal notices a dead worker through a 10 s workflow-task timeout by default. Goals
(issue 16): p50 <= 3 s after SIGKILL; after a hang, heartbeat timeout + <= 5 s. Needs Redis for the broker and
the heartbeat store (``BENCH_REDIS_URL``, default redis://127.0.0.1:6379/9) and real PostgreSQL.
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402
from bench._pg import free_port  # noqa: E402

if _run.SMOKE:  # detection by the heartbeat timeout in seconds, not tens of them; instances beat every second
    os.environ.setdefault("HEARTBEAT_TIMEOUT_S", "4")
HOST_HEARTBEAT_S = "1" if _run.SMOKE else ""

django.setup()

import psutil  # noqa: E402
import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _stack  # noqa: E402
from provisioning.choices import InstanceStatus  # noqa: E402
from provisioning.databases.servers import database_server_update, settings_server_ensure  # noqa: E402
from provisioning.drivers.local_process import live_host_pid  # noqa: E402
from provisioning.fleet.actions import instance_restart_request, instance_stop_planned  # noqa: E402
from provisioning.fleet.instances import instance_kill, instance_submit_task  # noqa: E402
from provisioning.models import AgentInstance, RecoveryEvent  # noqa: E402
from provisioning.recovery.heartbeats import heartbeat_store  # noqa: E402
from provisioning.recovery.sweep import recovery_candidates  # noqa: E402
from provisioning.resources.spec import tenant_spec  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402
from tests.pgbouncer import Bouncer, install_auth_query, start_pgbouncer  # noqa: E402
from vault.services import credential_put  # noqa: E402

console = Console(width=150)
N_KILLS = _run.size("BENCH_KILLS", 12, smoke=1)
N_SWEEP_KILLS = _run.size("BENCH_SWEEP_KILLS", 3, smoke=1)
N_HANGS = _run.size("BENCH_HANGS", 3, smoke=1)
N_POOLED_KILLS = _run.size("BENCH_POOLED_KILLS", 5, smoke=1)
N_FLEET = _run.size("BENCH_FLEET", 10000, smoke=200)
ROUNDS = _run.size("BENCH_RECOVERY_ROUNDS", 3, smoke=1)


@dataclass
class Phase:
    """One way of disrupting an instance, measured ``n`` times: seconds from the signal to detection/resume."""

    label: str
    slug: str
    n: int
    disrupt: Callable[[Tenant], int]
    worker_env: dict[str, str]
    detected: list[float] = field(default_factory=list)
    stopping: list[float] = field(default_factory=list)  # detection to the old host gone (the recovery's stop step)
    resumed: list[float] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    pooled: bool = False  # instances started in this phase's blocks connect through PgBouncer


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _sigkill(tenant: Tenant) -> int:
    return instance_kill(tenant=tenant, actor=SYSTEM)


def _sigstop(tenant: Tenant) -> int:
    pid = live_host_pid(tenant_spec(tenant))
    if pid is None:
        raise RuntimeError("no host to hang")
    os.kill(pid, signal.SIGSTOP)
    return pid


def _started_by(tenant: Tenant, worker: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Wait until the tenant's instance runs as a descendant of ``worker`` (its parent: the exit notice's)."""
    deadline = time.monotonic() + timeout
    while True:
        instance = AgentInstance.objects.get(tenant=tenant)
        pid = live_host_pid(tenant_spec(tenant)) if instance.status == InstanceStatus.RUNNING else None
        try:
            if pid and worker.pid in {p.pid for p in psutil.Process(pid).parents()}:
                return
        except psutil.Error:
            pass
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode} before starting {tenant.slug}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tenant.slug} not started by the block's worker within {timeout:.0f} s: "
                               f"{instance.status} {instance.status_reason}")
        time.sleep(0.2)


def run_block(phase: Phase, tenant: Tenant, n: int, env: dict[str, str], pooler_dsn: str) -> None:
    """``n`` disruptions of the tenant's instance, started by a fresh worker with the phase's settings."""
    with _run.Cleanup() as cleanup:
        if phase.pooled:
            database_server_update(name="default", actor=SYSTEM, pooler_dsn=pooler_dsn)
            cleanup.add("unpool the default server", database_server_update, name="default", actor=SYSTEM,
                        pooler_dsn="")
        worker = _stack.worker({**env, **phase.worker_env}, name=phase.slug)
        cleanup.add("stop the block's worker", _stack.stop, [worker])
        instance_restart_request(tenant=tenant, actor=SYSTEM)
        _started_by(tenant, worker)
        for _ in range(n):
            i = len(phase.resumed)
            instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.5, "step_sleep_s": 1.0,
                                                                      "topic": f"bench {i}"}, actor=SYSTEM)
            time.sleep(2.5)  # a step or two in: the signal lands mid-step
            pid = phase.disrupt(tenant)
            hit = time.time()
            deadline = time.monotonic() + 120
            while True:
                event = RecoveryEvent.objects.filter(tenant=tenant).order_by("-id").first()
                if event and event.detected_at.timestamp() > hit and event.outcome in ("succeeded", "failed"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{phase.label}: no recovery within 120 s")
                time.sleep(0.1)
            if psutil.pid_exists(pid):  # a hung host the recovery left behind would be a finding: say so
                console.print(f"  [red]pid {pid} still exists after the recovery[/red]")
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            if event.outcome != "succeeded" or event.resumed_at is None:
                raise RuntimeError(f"{phase.label} {i}: recovery failed: {event.detail}")
            phase.detected.append(event.detected_at.timestamp() - hit)
            phase.stopping.append((event.stopped_at - event.detected_at).total_seconds() if event.stopped_at else 0)
            phase.resumed.append(event.resumed_at.timestamp() - hit)
            phase.lost.append(event.steps_lost or 0)
            phase.reasons.add(event.reason)
            console.print(f"  {phase.label} {i + 1}/{phase.n}: detected {phase.detected[-1]:.2f} s, stop step "
                          f"{phase.stopping[-1]:.2f} s, resumed {phase.resumed[-1]:.2f} s after the signal "
                          f"({event.reason}), steps lost {phase.lost[-1]}")
            _stack.wait_ready(tenant, timeout=120)
        instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="benchmark block over")


def time_to_recover(operator) -> list[Phase]:  # type: ignore[no-untyped-def]
    port = free_port()
    sink_ports = {"smtp": free_port(), "payments": free_port()}
    extra = (f"AGENT_SMTP_URL=smtp://127.0.0.1:{sink_ports['smtp']},"
             f"AGENT_PAYMENTS_URL=http://127.0.0.1:{sink_ports['payments']},AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S=0"
             + (f",AGENT_HEARTBEAT_INTERVAL_S={HOST_HEARTBEAT_S}" if HOST_HEARTBEAT_S else ""))
    env = {**os.environ, "CONTROL_PLANE_INTERNAL_URL": f"http://127.0.0.1:{port}", "INSTANCE_EXTRA_ENV": extra,
           "AGENT_SMTP_SINK_PORT": str(sink_ports["smtp"]), "AGENT_PAYMENTS_PORT": str(sink_ports["payments"])}
    os.environ.update(CONTROL_PLANE_INTERNAL_URL=env["CONTROL_PLANE_INTERNAL_URL"], INSTANCE_EXTRA_ENV=extra)
    settings.CONTROL_PLANE_INTERNAL_URL = env["CONTROL_PLANE_INTERNAL_URL"]
    settings.INSTANCE_EXTRA_ENV = dict(kv.split("=", 1) for kv in extra.split(","))
    phases = [
        Phase("SIGKILL, exit notice on", "ttr-notice", N_KILLS, _sigkill, {"LOCAL_EXIT_NOTICE": "true"}),
        Phase("SIGKILL, exit notice off", "ttr-sweep", N_SWEEP_KILLS, _sigkill,
              {"LOCAL_EXIT_NOTICE": "false"}),
        Phase("SIGSTOP hang", "ttr-hang", N_HANGS, _sigstop, {"LOCAL_EXIT_NOTICE": "true"}),
        Phase("SIGKILL through PgBouncer, exit notice on", "ttr-pooled", N_POOLED_KILLS, _sigkill,
              {"LOCAL_EXIT_NOTICE": "true"}, pooled=True),
    ]
    with _run.Cleanup() as cleanup:
        cleanup.add("stop the instances", _setup.stop_hosts)
        services = [
            _spawn([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], env),
            _spawn([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--pidfile=", "--scheduler",
                    "controlplane.leases.beat:LeaderScheduler"], env),
            _spawn([sys.executable, "-m", "agent_examples.peers.smtp"], env),
            _spawn([sys.executable, "-m", "agent_examples.peers.payments"], env),
        ]
        cleanup.add("stop the web server, beat and peers", _stack.stop, services)
        bouncer = _pgbouncer()
        cleanup.add("stop PgBouncer", bouncer.stop)
        info = psycopg.conninfo.conninfo_to_dict(settings.TENANT_DATABASE_URL or os.environ["DATABASE_URL"])
        pooler_dsn = f"host=127.0.0.1 port={bouncer.port} dbname={info['dbname']}"
        onboarding = _stack.worker(env, name="onboarding")
        try:
            tenant = _stack.onboard(operator, "ttr")
        finally:
            _stack.stop([onboarding])
        credential_put(tenant=tenant, name="smtp", value="bench", actor=SYSTEM)
        instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="each block starts it again")
        rounds = max(1, ROUNDS)
        for r in range(rounds):
            for phase in phases[r % len(phases):] + phases[:r % len(phases)]:
                block = min(math.ceil(phase.n / rounds), phase.n - len(phase.resumed))
                if block > 0:
                    console.print(f"[bold]{phase.label}[/bold]: round {r + 1}/{rounds}, {block} time(s)")
                    run_block(phase, tenant, block, env, pooler_dsn)
    return phases


def _pgbouncer() -> Bouncer:
    """PgBouncer (transaction mode, auth_query) in front of the tenant database; the pooled phase's blocks record
    it as the default server's pooler, so the instances they start connect through it (AGENT_DATABASE_POOLED=1)."""
    info = psycopg.conninfo.conninfo_to_dict(settings.TENANT_DATABASE_URL or os.environ["DATABASE_URL"])
    auth_user, auth_password = f"{_setup.ROLE_PREFIX}pgbouncer_auth", secrets.token_urlsafe(18)
    install_auth_query(psycopg.conninfo.make_conninfo(**info), auth_user=auth_user, auth_password=auth_password)
    settings_server_ensure()
    return start_pgbouncer(server_host=str(info.get("host", "127.0.0.1")), server_port=int(info.get("port", 5432)),
                           databases=[str(info["dbname"])], name="recovery", auth_user=(auth_user, auth_password))


def sweep_scale(operator) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(empty sweep s, full sweep s, stale found): detection over N_FLEET running instances, best of 5 each, the
    two alternating. Empty: no heartbeat in the store (a key prefix nothing was written under); full: every instance
    has one, 2 % of them an hour old."""
    tenants = [Tenant(operator=operator, slug=f"fleet-{i}", name=f"F{i}", status="ready") for i in range(N_FLEET)]
    Tenant.objects.bulk_create(tenants, batch_size=2000)
    instances = [AgentInstance(id=uuid.uuid4(), tenant=t, status="running") for t in tenants]
    AgentInstance.objects.bulk_create(instances, batch_size=2000)
    full_prefix = settings.HEARTBEAT_KEY_PREFIX
    prefixes = {"empty": f"{full_prefix}-empty", "full": full_prefix}

    now = time.time()
    store = heartbeat_store()
    stale = N_FLEET // 50
    for i, inst in enumerate(instances):
        seen = now - 3600 if i < stale else now
        store.record(str(inst.pk), {"status": "idle", "progress_seq": 1}, now=seen)
    best = {"empty": float("inf"), "full": float("inf")}
    found = 0
    try:
        for i in range(5):
            for name in ("empty", "full") if i % 2 == 0 else ("full", "empty"):
                settings.HEARTBEAT_KEY_PREFIX = prefixes[name]
                start = time.perf_counter()
                # As of the moment the heartbeats were written: writing 10,000 of them on a loaded machine can take
                # longer than the heartbeat timeout, which would make the first ones look silent.
                candidates = recovery_candidates(now=now + 1)
                best[name] = min(best[name], time.perf_counter() - start)
                if name == "full":
                    found = len(candidates)
    finally:
        settings.HEARTBEAT_KEY_PREFIX = full_prefix
    return best["empty"], best["full"], found


def _p(samples: list[float]) -> str:
    p50, p95 = _setup.percentiles(samples)
    return f"{p50 / 1000:.2f} / {p95 / 1000:.2f} s"


def _sweep_every_s() -> float:
    """The beat's interval for the recovery sweep (a database row, read when beat starts); 1 s in a smoke run."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    sweep = PeriodicTask.objects.filter(task="provisioning.tasks.recovery_sweep_task")
    if _run.SMOKE:
        every_s, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
        sweep.update(interval=every_s)
    interval = sweep.select_related("interval").get().interval
    return float(interval.every) if interval.period == IntervalSchedule.SECONDS else float("nan")


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-ops", name="Bench", actor=SYSTEM)
    operator.tenant_quota = N_FLEET + 100
    operator.save()
    timeout = settings.HEARTBEAT_TIMEOUT_S
    console.print(f"Time to recover: heartbeat timeout {timeout:.0f} s, sweep every {_sweep_every_s():.0f} s (beat), "
                  "recovery stop grace "
                  f"{settings.RECOVERY_STOP_GRACE_S:.0f} s; {ROUNDS} rounds of blocks")
    kill, sweep_only, hang, pooled = time_to_recover(operator)
    empty_s, full_s, found = sweep_scale(operator)
    table = Table(title="Recovery (time from the signal; p50 / p95)")
    for col in ("measure", "detected", "stop step", "resumed (time to recover)", "anchor / goal"):
        table.add_column(col)
    k50 = statistics.median(kill.resumed)
    s50 = statistics.median(sweep_only.resumed)
    h50 = statistics.median(hang.resumed)
    table.add_row(f"SIGKILL, exit notice on (n={len(kill.resumed)})", _p(kill.detected),
                  _p(kill.stopping), _p(kill.resumed),
                  f"goal p50 <= 3 s: {'met' if k50 <= 3 else 'NOT met'}; {s50 / k50:.1f}x faster than the sweep; "
                  "Temporal: 10 s task timeout")
    table.add_row(f"SIGKILL, exit notice off: sweep only (n={len(sweep_only.resumed)})", _p(sweep_only.detected),
                  _p(sweep_only.stopping), _p(sweep_only.resumed), "anchor (old behaviour, same run)")
    table.add_row(f"SIGSTOP hang (n={len(hang.resumed)}; {', '.join(sorted(hang.reasons))})", _p(hang.detected),
                  _p(hang.stopping), _p(hang.resumed), f"goal <= heartbeat timeout + 5 s = {timeout + 5:.0f} s: "
                  f"{'met' if h50 <= timeout + 5 else 'NOT met'} (p50 {h50 - timeout:+.1f} s over the timeout)")
    pk50 = statistics.median(pooled.resumed)
    table.add_row(f"SIGKILL through PgBouncer, exit notice on (n={len(pooled.resumed)})", _p(pooled.detected),
                  _p(pooled.stopping), _p(pooled.resumed),
                  f"goal p50 <= 3 s: {'met' if pk50 <= 3 else 'NOT met'}; {pk50 / k50:.2f}x the direct kill; the "
                  "lease TTL it no longer waits out: 15 s")
    lost = kill.lost + sweep_only.lost + pooled.lost
    table.add_row("steps lost per SIGKILL (mean / max)", "", "", f"{statistics.mean(lost):.2f} / {max(lost)}",
                  "at most the step in flight")
    table.add_row(f"sweep detection, {N_FLEET} instances, {found} stale", "", "", f"{full_s * 1000:.1f} ms",
                  f"{full_s / empty_s:.1f}x the empty sweep ({empty_s * 1000:.2f} ms); goal < 100 ms")
    console.print(table)
    out: dict[str, object] = {"heartbeat_timeout_s": timeout, "fleet": N_FLEET, "stale_found": found,
                              "sweep_ms": full_s * 1000, "empty_sweep_ms": empty_s * 1000,
                              "steps_lost_mean": statistics.mean(lost), "steps_lost_max": max(lost)}
    for key, phase in (("kill_notice", kill), ("kill_sweep_only", sweep_only), ("hang", hang),
                       ("kill_pooled", pooled)):
        for what in ("detected", "stopping", "resumed"):
            p50, p95 = _setup.percentiles(getattr(phase, what))
            out[f"{key}_{what}_p50_s"], out[f"{key}_{what}_p95_s"] = p50 / 1000, p95 / 1000
        out[f"{key}_n"] = len(phase.resumed)
    _run.write_json("recovery", out)
    _run.ratio_line("recovery", "time to recover p50 after SIGKILL, sweep only / exit notice", s50 / k50,
                    f"(exit notice {k50:.2f} s; goal <= 3 s)")
    _run.ratio_line("recovery", "time to recover p50, through PgBouncer / direct", pk50 / k50, "(goal p50 <= 3 s)")
    _run.ratio_line("recovery", f"sweep detection over {N_FLEET} instances, {found} stale / empty sweep",
                    full_s / empty_s, f"(empty {empty_s * 1000:.2f} ms; goal < 100 ms)")


if __name__ == "__main__":
    main()
