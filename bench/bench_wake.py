"""Scale to zero benchmark: wake from zero to the first reply, against two anchors measured in the same run.

Each sample: the instance is put to sleep (``provisioning.sleep.instance_sleep``: a clean stop, marked asleep),
then a message goes through the control plane (gunicorn, production config): 202, the wake task boots the
instance in a Celery worker, read-back, delivery; the clock stops at the reply stream's first chunk. Anchors:
the same message to an instance that is already running (send -> first chunk), and a plain start of a stopped
instance (``instance_start``: spawn, read-back, ready), the floor under any wake. Goal: wake p50 < 2 s.

Real parts: PostgreSQL, Redis as the broker (``BENCH_REDIS_URL``, default redis://127.0.0.1:6379/9), a Celery
worker, gunicorn, real agent-hosts running the conversational test agent (`tests.runtime.agents:AGENTS`).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PROVISIONING_RUNTIME_DRIVER"] = ""
os.environ.setdefault("CELERY_BROKER_URL", os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))
from bench import _setup  # noqa: E402
from bench._http import request  # noqa: E402
from bench._pg import free_port  # noqa: E402

os.environ["HEARTBEAT_KEY_PREFIX"] = f"cp-bench-{_setup.RUN_ID}:hb"
os.environ["TENANT_DATABASE_ALLOW_INSECURE_AUTH"] = "true"  # the machine's PostgreSQL trusts 127.0.0.1
N = int(os.environ.get("BENCH_WAKES", "20"))
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_POLL_INTERVAL_S": "0.05"}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.choices import InstanceStatus, WakeOutcome  # noqa: E402
from provisioning.instances import instance_start  # noqa: E402
from provisioning.models import AgentInstance, InstanceWake  # noqa: E402
from provisioning.sleep import instance_sleep  # noqa: E402
from provisioning.spec import tenant_spec  # noqa: E402
from provisioning.tenant_actions import instance_stop_planned  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create, tenant_onboard  # noqa: E402
from tenants.tokens import operator_token_issue  # noqa: E402

console = Console()


def _first_chunk(port: int, path: str, headers: dict[str, str]) -> None:
    """Read a reply stream up to its first `delta` (or `reply`) event."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", path, headers=headers)
        resp = c.getresponse()
        while True:
            line = resp.fp.readline()
            if not line:
                raise RuntimeError(f"stream ended before a chunk: {path}")
            if line.startswith((b"event: delta", b"event: reply")):
                return
    finally:
        c.close()


def _put_to_sleep(instance_pk: object) -> None:
    """Asleep once the previous reply's task has finished (a busy instance is never put to sleep)."""
    deadline = time.monotonic() + 60
    while True:
        outcome = instance_sleep(instance=AgentInstance.objects.get(pk=instance_pk), idle_s=0)
        if outcome == "asleep":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the instance would not fall asleep: {outcome}")
        time.sleep(0.1)


def main() -> None:
    call_command("migrate", verbosity=0)
    # Hosts this process starts (the plain-start anchor) are killed at the end, after the database is gone.
    settings.LOCAL_EXIT_NOTICE = False
    web_port = free_port()
    base = f"http://127.0.0.1:{web_port}"
    settings.CONTROL_PLANE_INTERNAL_URL = base
    settings.INSTANCE_EXTRA_ENV = EXTRA
    env = {**os.environ, "CONTROL_PLANE_INTERNAL_URL": base}
    web_env = {**env, "GUNICORN_BIND": f"127.0.0.1:{web_port}", "GUNICORN_WORKERS": "2", "DB_CONN_MAX_AGE": "60"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py", "--access-logfile",
                          "/dev/null", "controlplane.wsgi:application"], cwd=ROOT, env=web_env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "-Q",
                          os.environ["CELERY_TASK_DEFAULT_QUEUE"], "--without-gossip", "--without-mingle"], cwd=ROOT,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        operator = operator_create(slug="bench-wake", name="Bench", actor=SYSTEM)
        token = operator_token_issue(operator=operator, actor=SYSTEM).plaintext
        tenant, _ = tenant_onboard(operator=operator, slug="wake", name="Wake", actor=SYSTEM)
        deadline = time.monotonic() + 180
        while Tenant.objects.get(pk=tenant.pk).status != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"onboarding did not finish: {Tenant.objects.get(pk=tenant.pk).status_reason}")
            time.sleep(0.3)
        instance_pk = AgentInstance.objects.get(tenant=tenant).pk
        tid = str(tenant.id)
        bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while request(web_port, "GET", "/healthz", b"", {})[0] != 200:
            time.sleep(0.2)

        def send_to_first_chunk(expect_wake: bool) -> float:
            body = json.dumps({"content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, raw = request(web_port, "POST", f"/api/v1/tenants/{tid}/threads/w/messages", body,
                                   {**bearer, "Idempotency-Key": uuid.uuid4().hex})
            out = json.loads(raw)
            if status not in (201, 202) or (expect_wake and status != 202):
                raise RuntimeError(f"POST: {status} {out}")
            _first_chunk(web_port, f"/api/v1/tenants/{tid}/threads/w/messages/{out['inbox']['id']}/reply", bearer)
            return time.perf_counter() - t0

        for _ in range(10):  # warm the web workers' connections and the signing-key cache
            send_to_first_chunk(False)
        wake_s, running_s, start_s = [], [], []
        console.print(f"{N} wakes from zero, {N} messages to a running instance, {N} plain starts ...")
        for i in range(N):
            _put_to_sleep(instance_pk)
            wake_s.append(send_to_first_chunk(True))
            time.sleep(0.2)
            running_s.append(send_to_first_chunk(False))
            time.sleep(0.3)  # the reply's task finishes before the planned stop
            instance_stop_planned(tenant=tenant, actor=SYSTEM, reason="bench: plain restart anchor")
            t0 = time.perf_counter()
            instance_start(tenant=tenant, actor=SYSTEM)
            start_s.append(time.perf_counter() - t0)
            console.print(f"  {i + 1}/{N}: wake -> first chunk {wake_s[-1]:.2f} s, running {running_s[-1] * 1000:.0f}"
                          f" ms, plain start {start_s[-1]:.2f} s")
        wakes = list(InstanceWake.objects.filter(tenant=tenant, outcome=WakeOutcome.SUCCEEDED))
        boots = [w.boot_s for w in wakes if w.boot_s is not None]
        if len(wakes) != N or AgentInstance.objects.get(pk=instance_pk).status != InstanceStatus.RUNNING:
            raise RuntimeError(f"{len(wakes)} successful wakes recorded for {N} samples")
        w50, w95 = _setup.percentiles(wake_s)
        r50, r95 = _setup.percentiles(running_s)
        s50, s95 = _setup.percentiles(start_s)
        b50, b95 = _setup.percentiles(boots)
        table = Table(title="Scale to zero: wake from zero vs a running instance and a plain start (same run)")
        for col in ("measure", "p50", "p95", "against the anchor"):
            table.add_column(col)
        table.add_row(f"wake: send -> first reply chunk (n={N})", f"{w50 / 1000:.2f} s", f"{w95 / 1000:.2f} s",
                      f"goal p50 < 2 s; {w50 / s50:.2f}x a plain start, +{w50 - r50:.0f} ms over a running one")
        table.add_row("  of which accepted -> up and read back (InstanceWake)", f"{b50 / 1000:.2f} s",
                      f"{b95 / 1000:.2f} s", "what the dashboard shows")
        table.add_row(f"anchor: running instance, send -> first chunk (n={N})", f"{r50:.0f} ms", f"{r95:.0f} ms", "")
        table.add_row(f"anchor: plain start of a stopped instance (n={N})", f"{s50 / 1000:.2f} s",
                      f"{s95 / 1000:.2f} s", "instance_start: spawn, read-back, ready")
        console.print(table)
        results = ROOT / "var" / "bench"
        results.mkdir(parents=True, exist_ok=True)
        (results / "wake.json").write_text(json.dumps({
            "wake_first_chunk_ms": {"p50": w50, "p95": w95}, "wake_boot_ms": {"p50": b50, "p95": b95},
            "running_first_chunk_ms": {"p50": r50, "p95": r95}, "plain_start_ms": {"p50": s50, "p95": s95},
            "n": N}, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        from provisioning.drivers.local_process import live_host_pid

        for t in Tenant.objects.filter(resources__kind="volume"):
            pid = live_host_pid(tenant_spec(t))
            if pid:
                os.kill(pid, 9)
        if settings.HEARTBEAT_REDIS_URL:
            import redis

            client = redis.Redis.from_url(settings.HEARTBEAT_REDIS_URL)
            for key in client.scan_iter(f"{settings.HEARTBEAT_KEY_PREFIX}:*"):
                client.delete(key)


if __name__ == "__main__":
    main()
