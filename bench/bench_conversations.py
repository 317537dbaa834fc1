"""Conversation benchmark: a message's round trip through the control plane into the instance's log, and the
latency of the first streamed chunk of the reply, each against a direct signed call to the instance in the same
run (the anchor). Goal: proxy overhead <= 5 ms at p50.

Real parts: the control plane under gunicorn with the production config (deploy/gunicorn.conf.py: gthread
workers, persistent database connections), a Celery worker for onboarding, a real
agent-host with the conversational test agent (`tests.runtime.agents:AGENTS`, kind `chat`), PostgreSQL.
Samples alternate direct / proxied so drift hits both alike.
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
from bench import _setup  # noqa: E402
from bench._http import request  # noqa: E402
from bench._pg import free_port  # noqa: E402

N = int(os.environ.get("BENCH_MESSAGES", "200"))
N_STREAM = int(os.environ.get("BENCH_STREAMS", "50"))
EXTRA = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_POLL_INTERVAL_S": "0.05"}
os.environ["INSTANCE_EXTRA_ENV"] = json.dumps(EXTRA)
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from conversations.signing import sign  # noqa: E402
from provisioning.models import ProvisionedResource  # noqa: E402
from provisioning.spec import tenant_spec  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create, tenant_onboard  # noqa: E402
from tenants.tokens import operator_token_issue  # noqa: E402

console = Console()


def _first_delta(port: int, path: str, headers: dict[str, str]) -> float:
    """Seconds until the first `delta` (or `reply`) event of a reply stream."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path, headers=headers)
        resp = c.getresponse()
        while True:
            line = resp.fp.readline()
            if not line:
                raise RuntimeError(f"stream ended before a chunk: {path}")
            if line.startswith((b"event: delta", b"event: reply")):
                return time.perf_counter() - t0
    finally:
        c.close()


def main() -> None:
    call_command("migrate", verbosity=0)
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
        operator = operator_create(slug="bench-talk", name="Bench", actor=SYSTEM)
        token = operator_token_issue(operator=operator, actor=SYSTEM).plaintext
        tenant, _ = tenant_onboard(operator=operator, slug="talk", name="Talk", actor=SYSTEM)
        deadline = time.monotonic() + 180
        while Tenant.objects.get(pk=tenant.pk).status != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"onboarding did not finish: {Tenant.objects.get(pk=tenant.pk).status_reason}")
            time.sleep(0.3)
        volume = ProvisionedResource.objects.get(tenant=tenant, kind="volume").details["path"]
        inst_port = int((Path(volume) / ".host" / "http-port").read_text())
        inst_token = tenant_spec(tenant, with_secrets=("instance_token",)).secrets["instance_token"]
        tid = str(tenant.id)
        bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while request(web_port, "GET", "/healthz", b"", {})[0] != 200:
            time.sleep(0.2)

        def direct(thread: str) -> tuple[float, str]:
            mid = str(uuid.uuid4())
            path = f"/v1/threads/{thread}/messages"
            body = json.dumps({"id": mid, "content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, _ = request(inst_port, "POST", path, body, {
                "Authorization": sign(inst_token, tid, "POST", path, body), "Content-Type": "application/json"})
            took = time.perf_counter() - t0
            if status != 201:
                raise RuntimeError(f"direct POST: {status}")
            return took, mid

        def proxied(thread: str) -> tuple[float, str]:
            body = json.dumps({"content": "hello there"}).encode()
            t0 = time.perf_counter()
            status, raw = request(web_port, "POST", f"/api/v1/tenants/{tid}/threads/{thread}/messages", body,
                                   {**bearer, "Idempotency-Key": uuid.uuid4().hex})
            took = time.perf_counter() - t0
            out = json.loads(raw)
            if status not in (201, 202) or out["inbox"]["status"] != "delivered":
                raise RuntimeError(f"proxied POST: {status} {out}")
            return took, str(out["inbox"]["id"])

        for _ in range(40):  # warm both paths (every thread's database connection, the signing-key cache)
            direct("warm")
            proxied("warm")
        d_post, p_post = [], []
        console.print(f"Round trip of {N} messages each way (POST, durable in the instance's log, answered) ...")
        for _ in range(N):
            d_post.append(direct("rt")[0])
            p_post.append(proxied("rt")[0])
            time.sleep(0.02)  # let the agent answer: the next sample does not queue behind this one's reply
        d_first, p_first = [], []
        console.print(f"First streamed chunk of {N_STREAM} replies each way ...")
        for _ in range(N_STREAM):  # from sending the message to the first chunk of its reply, both ways
            t0 = time.perf_counter()
            _, mid = direct("st")
            path = f"/v1/threads/st/messages/{mid}/reply"
            _first_delta(inst_port, path, {"Authorization": sign(inst_token, tid, "GET", path, b"")})
            d_first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _, mid = proxied("st")
            _first_delta(web_port, f"/api/v1/tenants/{tid}/threads/st/messages/{mid}/reply", bearer)
            p_first.append(time.perf_counter() - t0)
            time.sleep(0.05)
        dp50, dp95 = _setup.percentiles(d_post)
        pp50, pp95 = _setup.percentiles(p_post)
        df50, df95 = _setup.percentiles(d_first)
        pf50, pf95 = _setup.percentiles(p_first)
        table = Table(title="Conversations: control plane vs direct call to the instance (same run)")
        for col in ("measure", "through the control plane", "direct (anchor)", "overhead"):
            table.add_column(col)
        table.add_row(f"message round trip p50 (n={N})", f"{pp50:.1f} ms", f"{dp50:.1f} ms",
                      f"{pp50 - dp50:+.1f} ms (goal <= 5 ms)")
        table.add_row("message round trip p95", f"{pp95:.1f} ms", f"{dp95:.1f} ms", f"{pp95 - dp95:+.1f} ms")
        table.add_row(f"first streamed chunk p50 (n={N_STREAM})", f"{pf50:.1f} ms", f"{df50:.1f} ms",
                      f"{pf50 - df50:+.1f} ms (send -> first chunk)")
        table.add_row("first streamed chunk p95", f"{pf95:.1f} ms", f"{df95:.1f} ms", "")
        console.print(table)
        results = ROOT / "var" / "bench"
        results.mkdir(parents=True, exist_ok=True)
        (results / "conversations.json").write_text(json.dumps({
            "round_trip_ms": {"proxied_p50": pp50, "proxied_p95": pp95, "direct_p50": dp50, "direct_p95": dp95},
            "first_chunk_ms": {"proxied_p50": pf50, "proxied_p95": pf95, "direct_p50": df50, "direct_p95": df95},
            "n": N, "n_stream": N_STREAM}, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        from provisioning.drivers.local_process import live_host_pid

        for t in Tenant.objects.all():
            pid = live_host_pid(tenant_spec(t))
            if pid:
                os.kill(pid, 9)


if __name__ == "__main__":
    main()
