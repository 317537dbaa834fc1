"""Issue 17 (honest health): ``/healthz`` says the process answers, ``/readyz`` whether its database, broker and
cache do. A dependency down is a 503 problem+json naming it, with no address or user name in the body."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from controlplane.liveness import service_beat, service_exited
from tests.conftest import BASE_DIR, subprocess_env

pytestmark = pytest.mark.django_db

PROBE = ("import json; from django.test import Client; r = Client().get('/readyz'); "
         "print(json.dumps({'status': r.status_code, 'type': r['Content-Type'], 'body': r.content.decode()}))")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def _readyz(**env: str) -> dict:
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", PROBE], cwd=BASE_DIR,
                          env=subprocess_env(**env), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _beat_as_this_process(*services: str) -> None:
    """A heartbeat of this (live) process for each service, as the worker's and beat's threads write it."""
    for service in services:
        service_beat(service, pid=os.getpid(), host=socket.gethostname(), started_at=time.time())


def test_healthz_and_readyz_when_everything_answers(client):
    _beat_as_this_process("worker", "beat")
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.content
    body = ready.json()
    assert body["status"] == "ready" and set(body["checks"]) == {"database", "broker", "cache", "worker", "beat"}
    assert all(c["ok"] for c in body["checks"].values()), body
    assert body["checks"]["worker"]["detail"].startswith(f"pid {os.getpid()}, heartbeat ")


def test_a_worker_without_a_fresh_heartbeat_is_a_503_naming_it(client, settings):
    """The heartbeat's age decides (the supervisor's exit notice is tested with real processes in
    tests/controlplane/test_supervised_stack.py); an exit the supervisor reported is down at once, with its reason."""
    _beat_as_this_process("beat")
    service_beat("worker", pid=os.getpid(), host=socket.gethostname(), started_at=time.time() - 60,
                 now=time.time() - settings.SERVICE_HEARTBEAT_TIMEOUT_S - 1)
    resp = client.get("/readyz")
    assert resp.status_code == 503 and resp["Content-Type"] == "application/problem+json"
    problem = resp.json()
    assert problem["checks"]["worker"]["ok"] is False and problem["checks"]["beat"]["ok"] is True
    assert f"the worker is down (no heartbeat from pid {os.getpid()} for " in problem["detail"], problem
    assert socket.gethostname() not in resp.content.decode()  # no host name on an open endpoint
    _beat_as_this_process("worker")
    assert client.get("/readyz").status_code == 200
    service_exited("worker", pid=os.getpid(), host=socket.gethostname(), detail="terminated by SIGKILL")
    problem = client.get("/readyz").json()
    assert f"the worker is down (pid {os.getpid()} terminated by SIGKILL " in problem["detail"], problem


@pytest.mark.parametrize("dependency", ["broker", "database"])
def test_a_dependency_down_is_a_503_problem_naming_it(dependency):
    port = _closed_port()
    env = ({"CELERY_BROKER_URL": f"redis://127.0.0.1:{port}/0", "CACHE_URL": ""} if dependency == "broker"
           else {"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nothing"})
    seen = _readyz(**env)
    assert seen["status"] == 503 and seen["type"] == "application/problem+json", seen
    problem = json.loads(seen["body"])
    assert problem["type"].endswith("/not-ready") and problem["status"] == 503
    assert f"the {dependency} does not answer" in problem["detail"], problem
    assert problem["checks"][dependency]["ok"] is False
    assert str(port) not in seen["body"] and "127.0.0.1" not in seen["body"]  # no addresses on an open endpoint


def test_an_unknown_api_path_is_a_problem_not_an_html_page(client):
    for path in ("/api/v1/no-such-thing", "/api/v2/tenants", "/internal/v1/nothing"):
        resp = client.get(path)
        assert resp.status_code == 404 and resp["Content-Type"] == "application/problem+json", (path, resp.content)
        assert resp.json()["type"].endswith("/not-found") and resp.json()["instance"] == path
    page = client.get("/dashboard/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def test_a_dead_database_is_one_sentence_and_the_traceback_only_with_verbose():
    port = _closed_port()
    env = subprocess_env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/nothing")
    short = subprocess.run([sys.executable, "manage.py", "migrate"], cwd=BASE_DIR, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert short.returncode == 1
    lines = short.stderr.strip().splitlines()
    assert lines[0].startswith("error: cannot use the database (") and "DATABASE_URL" in lines[0], short.stderr
    assert len(lines) == 2 and "Traceback" not in short.stderr, short.stderr
    verbose = subprocess.run([sys.executable, "manage.py", "migrate", "--verbose"], cwd=BASE_DIR, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert verbose.returncode != 0 and "Traceback (most recent call last)" in verbose.stderr
