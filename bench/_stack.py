"""The control plane's processes and tenants as benchmarks drive them: Celery workers, gunicorn, an operator with
an API token, a tenant onboarded and ready. Imported after ``bench._setup`` and ``django.setup()``.

No figures here: what a bench times stays in the bench.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from bench import _setup
from bench._http import request
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.choices import TenantStatus
from tenants.models import Tenant
from tenants.services import operator_create
from tenants.tokens import operator_token_issue

__all__ = ["ROOT", "worker", "web", "stop", "wait_web", "operator_with_token", "wait_ready", "onboard"]

ROOT = Path(__file__).resolve().parent.parent


def worker(env: dict[str, str] | None = None, *, name: str = "bench", stderr: IO[bytes] | int | None = None
           ) -> subprocess.Popen[bytes]:
    """A real Celery worker (solo pool) on this run's queue."""
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
                             "--loglevel=WARNING", "-Q", _setup.QUEUE, "--without-gossip", "--without-mingle",
                             "--without-heartbeat", "-n", f"{name}-{_setup.RUN_ID}@%h"],
                            cwd=ROOT, env=env or dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL if stderr is None else stderr)


def web(port: int, env: dict[str, str] | None = None, *, server: str = "gthread") -> subprocess.Popen[bytes]:
    """The control plane under gunicorn with the production config (deploy/gunicorn.conf.py: gthread workers, or
    with ``server="asgi"`` the reply-stream tier's uvicorn workers), two workers and persistent database
    connections."""
    web_env = {**(env or os.environ), "GUNICORN_BIND": f"127.0.0.1:{port}", "GUNICORN_WORKERS": "2",
               "GUNICORN_SERVER": server, "DB_CONN_MAX_AGE": "60"}
    return subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py",
                             "--access-logfile", "/dev/null"], cwd=ROOT,
                            env=web_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_web(port: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if request(port, "GET", "/healthz", b"", {}, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the web server exited with {proc.returncode} before answering /healthz")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the web server did not answer /healthz within {timeout:.0f} s")
        time.sleep(0.2)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate, wait, kill what is left: every process is waited for whatever the others do."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def operator_with_token(slug: str, *, tenant_quota: int | None = None):  # type: ignore[no-untyped-def]
    """(operator, plaintext API token)."""
    operator = operator_create(slug=slug, name=slug, actor=SYSTEM)
    if tenant_quota is not None:
        operator.tenant_quota = tenant_quota
        operator.save()
    return operator, operator_token_issue(operator=operator, actor=SYSTEM).plaintext


def wait_ready(tenant: Tenant, timeout: float = 180) -> Tenant:
    """The tenant once ready; raises at once when its onboarding (or recovery) failed, with the reason."""
    deadline = time.monotonic() + timeout
    while True:
        current = Tenant.objects.get(pk=tenant.pk)
        if current.status == TenantStatus.READY:
            return current
        if current.status == TenantStatus.FAILED:
            raise RuntimeError(f"tenant {current.slug} failed: {current.status_reason}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"tenant {current.slug} not ready within {timeout:.0f} s: {current.status} "
                               f"{current.status_reason}")
        time.sleep(0.2)


def onboard(operator, slug: str, *, timeout: float = 180) -> Tenant:  # type: ignore[no-untyped-def]
    """``tenant_onboard``, then wait for a worker to run the whole onboarding workflow."""
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug=slug, name=slug, actor=SYSTEM)
    return wait_ready(tenant, timeout)
