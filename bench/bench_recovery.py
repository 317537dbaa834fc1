"""Recovery benchmark: time to recover after SIGKILL (default heartbeat settings), work lost per crash,
and one sweep's detection time over 10,000 instances (2% stale) against an empty sweep.

Anchor for time to recover: Temporal notices a dead worker through a 10 s workflow-task timeout by
default; our goal is under twice our own heartbeat timeout. Needs Redis for the heartbeat store
(``BENCH_REDIS_URL``, default redis://127.0.0.1:6379/9) and real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CELERY_BROKER_URL", os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
from bench import _setup  # noqa: E402

os.environ["HEARTBEAT_KEY_PREFIX"] = f"cp-bench-{_setup.RUN_ID}:hb"
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.heartbeats import heartbeat_store  # noqa: E402
from provisioning.instances import instance_kill, instance_submit_task  # noqa: E402
from provisioning.models import AgentInstance, RecoveryEvent  # noqa: E402
from provisioning.recovery import recovery_candidates  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create, tenant_onboard  # noqa: E402
from vault.services import credential_put  # noqa: E402

console = Console()
N_KILLS = int(os.environ.get("BENCH_KILLS", "20"))
N_FLEET = int(os.environ.get("BENCH_FLEET", "10000"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def time_to_recover(operator) -> tuple[list[float], list[int]]:  # type: ignore[no-untyped-def]
    port = _free_port()
    sink_ports = {"smtp": _free_port(), "payments": _free_port()}
    extra = (f"AGENT_SMTP_URL=smtp://127.0.0.1:{sink_ports['smtp']},"
             f"AGENT_PAYMENTS_URL=http://127.0.0.1:{sink_ports['payments']}")
    env = {**os.environ, "CONTROL_PLANE_INTERNAL_URL": f"http://127.0.0.1:{port}", "INSTANCE_EXTRA_ENV": extra,
           "AGENT_SMTP_SINK_PORT": str(sink_ports["smtp"]), "AGENT_PAYMENTS_PORT": str(sink_ports["payments"])}
    os.environ.update(CONTROL_PLANE_INTERNAL_URL=env["CONTROL_PLANE_INTERNAL_URL"], INSTANCE_EXTRA_ENV=extra)
    settings.CONTROL_PLANE_INTERNAL_URL = env["CONTROL_PLANE_INTERNAL_URL"]
    settings.INSTANCE_EXTRA_ENV = dict(kv.split("=", 1) for kv in extra.split(","))
    procs = [
        _spawn([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], env),
        _spawn([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "-Q",
                os.environ["CELERY_TASK_DEFAULT_QUEUE"], "--without-gossip", "--without-mingle"], env),
        _spawn([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--pidfile=", "--scheduler",
                "django_celery_beat.schedulers:DatabaseScheduler"], env),
        _spawn([sys.executable, "-m", "agent_examples.peers.smtp"], env),
        _spawn([sys.executable, "-m", "agent_examples.peers.payments"], env),
    ]
    ttr: list[float] = []
    lost: list[int] = []
    try:
        tenant, _ = tenant_onboard(operator=operator, slug="ttr", name="TTR", actor=SYSTEM)
        deadline = time.monotonic() + 120
        while Tenant.objects.get(pk=tenant.pk).status != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"onboarding did not finish: {Tenant.objects.get(pk=tenant.pk).status_reason}")
            time.sleep(0.3)
        credential_put(tenant=tenant, name="smtp", value="bench", actor=SYSTEM)
        for i in range(N_KILLS):
            instance_submit_task(tenant=tenant, kind="demo", params={"search_s": 0.5, "step_sleep_s": 1.0,
                                                                      "topic": f"bench {i}"}, actor=SYSTEM)
            time.sleep(2.5)
            instance_kill(tenant=tenant, actor=SYSTEM)
            killed = time.time()
            deadline = time.monotonic() + 120
            while True:
                event = RecoveryEvent.objects.filter(tenant=tenant).order_by("-id").first()
                if event and event.detected_at.timestamp() > killed and event.outcome in ("succeeded", "failed"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("no recovery within 120 s")
                time.sleep(0.2)
            if event.outcome != "succeeded" or event.resumed_at is None:
                raise RuntimeError(f"recovery {i} failed: {event.detail}")
            ttr.append(event.resumed_at.timestamp() - killed)
            lost.append(event.steps_lost or 0)
            console.print(f"  kill {i + 1}/{N_KILLS}: resumed {ttr[-1]:.1f} s after SIGKILL, steps lost {lost[-1]}")
            while Tenant.objects.get(pk=tenant.pk).status != "ready":
                time.sleep(0.2)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        call_command("instance", "tasks", "bench-ops/ttr", stdout=open(os.devnull, "w"))  # noqa: SIM115
        from provisioning.drivers.local_process import live_host_pid
        from provisioning.spec import tenant_spec

        pid = live_host_pid(tenant_spec(Tenant.objects.get(slug="ttr")))
        if pid:
            os.kill(pid, 9)
    return ttr, lost


def sweep_scale(operator) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    store = heartbeat_store()
    tenants = [Tenant(operator=operator, slug=f"fleet-{i}", name=f"F{i}", status="ready") for i in range(N_FLEET)]
    Tenant.objects.bulk_create(tenants, batch_size=2000)
    instances = [AgentInstance(id=uuid.uuid4(), tenant=t, status="running") for t in tenants]
    AgentInstance.objects.bulk_create(instances, batch_size=2000)

    def timed() -> tuple[float, int]:
        best, found = float("inf"), 0
        for _ in range(5):
            start = time.perf_counter()
            found = len(recovery_candidates())
            best = min(best, time.perf_counter() - start)
        return best, found

    empty_s, _ = timed()
    now = time.time()
    stale = N_FLEET // 50
    for i, inst in enumerate(instances):
        seen = now - 3600 if i < stale else now
        store.record(str(inst.pk), {"status": "idle", "progress_seq": 1}, now=seen)
    full_s, found = timed()
    return empty_s, full_s, found


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-ops", name="Bench", actor=SYSTEM)
    operator.tenant_quota = N_FLEET + 100
    operator.save()
    console.print(f"Time to recover: {N_KILLS} SIGKILLs, heartbeat timeout {settings.HEARTBEAT_TIMEOUT_S:.0f} s, "
                  "sweep every 5 s (defaults)")
    ttr, lost = time_to_recover(operator)
    empty_s, full_s, found = sweep_scale(operator)
    p50, p95 = _setup.percentiles(ttr)
    table = Table(title="Recovery")
    for col in ("measure", "value", "anchor / goal"):
        table.add_column(col)
    table.add_row(f"time to recover, p50 (n={len(ttr)})", f"{p50 / 1000:.1f} s",
                  f"goal < {2 * settings.HEARTBEAT_TIMEOUT_S:.0f} s (2x heartbeat timeout); Temporal: 10 s timeout")
    table.add_row("time to recover, p95", f"{p95 / 1000:.1f} s", "")
    table.add_row("steps lost per crash (mean / max)", f"{statistics.mean(lost):.2f} / {max(lost)}",
                  "at most the step in flight")
    table.add_row(f"sweep detection, {N_FLEET} instances, {found} stale", f"{full_s * 1000:.1f} ms",
                  f"{full_s / empty_s:.1f}x the empty sweep ({empty_s * 1000:.2f} ms); goal < 100 ms")
    console.print(table)
    if settings.HEARTBEAT_REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.HEARTBEAT_REDIS_URL)
        for key in client.scan_iter(f"{settings.HEARTBEAT_KEY_PREFIX}:*"):
            client.delete(key)
    results = ROOT / "var" / "bench"
    results.mkdir(parents=True, exist_ok=True)
    (results / "recovery.json").write_text(json.dumps({
        "ttr_p50_s": p50 / 1000, "ttr_p95_s": p95 / 1000, "steps_lost_mean": statistics.mean(lost),
        "steps_lost_max": max(lost), "sweep_ms": full_s * 1000, "empty_sweep_ms": empty_s * 1000,
        "fleet": N_FLEET, "stale_found": found}, indent=2))


if __name__ == "__main__":
    main()
