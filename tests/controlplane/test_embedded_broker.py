"""Issue 31: with ``CELERY_BROKER_URL`` unset the broker is an embedded Redis (``controlplane/embedded_redis.py``),
not kombu's filesystem transport (whose worker died reading a message file not yet written).

A real worker and a real sender, both with the broker unset, meet on the Redis under their var/ directory: a
unix socket, a generated password that no log shows, the worker's liveness heartbeat in the same server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from controlplane.embedded_redis import embedded_redis_running, embedded_redis_stop
from dashboard.models import FleetSample
from tests.conftest import BASE_DIR, SESSION_TMP, subprocess_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SEND = ("import json; from django.conf import settings; from dashboard.tasks import history_sample_task; "
        "history_sample_task.delay(); "
        "print(json.dumps({'broker': settings.CELERY_BROKER_URL, 'heartbeats': settings.HEARTBEAT_REDIS_URL, "
        "'cache': settings.CACHES['default']['BACKEND']}))")


def test_a_task_round_trips_through_a_real_worker_on_the_embedded_redis():
    var = SESSION_TMP / "broker-var"
    env = subprocess_env(CONTROLPLANE_VAR_DIR=str(var))
    for unset in ("CELERY_BROKER_URL", "HEARTBEAT_REDIS_URL"):  # the CI machine's Redis: not this test's
        env.pop(unset)
    log_path = SESSION_TMP / "embedded-broker-worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--concurrency=1", "--loglevel=INFO",
             "-Q", settings.CELERY_TASK_DEFAULT_QUEUE], cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b" ready." in log_path.read_bytes() or worker.poll() is not None, timeout=90,
                 what="the worker connected to its broker")
        assert worker.poll() is None, log_path.read_text()[-3000:]
        before = FleetSample.objects.count()
        sent = subprocess.run([sys.executable, "manage.py", "shell", "-c", SEND], cwd=BASE_DIR, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert sent.returncode == 0, sent.stderr[-3000:]
        seen = json.loads(sent.stdout.strip().splitlines()[-1])
        sock = var / "redis" / "redis.sock"
        password = (var / "secrets" / "redis-password").read_text().strip()
        assert seen["broker"] == f"redis+socket://:{password}@{sock}", "the broker is the embedded Redis"
        assert seen["heartbeats"] == f"unix://:{password}@{sock}?db=0" and seen["cache"].endswith("RedisCache")

        wait_for(lambda: "history_sample_task" in log_path.read_text() and "succeeded" in log_path.read_text(),
                 timeout=60, what="the task ran in the worker")
        log = log_path.read_text()
        assert FleetSample.objects.count() > before, log[-3000:]  # and did its work
        assert password not in log and "filesystem" not in log  # the URL is shown masked, if at all

        server = redis.Redis(unix_socket_path=str(sock), password=password)
        assert server.exists(f"_kombu.binding.{settings.CELERY_TASK_DEFAULT_QUEUE}")  # the queue lived here
        workers = server.hgetall(f"{settings.HEARTBEAT_KEY_PREFIX}:svc:worker")  # its liveness (controlplane.liveness)
        assert any(json.loads(v)["pid"] == worker.pid for v in workers.values()), workers
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=str(sock)).ping()  # no password, no answer
        assert oct(sock.stat().st_mode & 0o777) == "0o700" and oct((var / "redis").stat().st_mode & 0o777) == "0o700"
        assert oct((var / "secrets" / "redis-password").stat().st_mode & 0o777) == "0o600"
        assert password not in Path(var / "redis" / "redis.log").read_text()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        pid = embedded_redis_running(var / "redis")
        assert embedded_redis_stop(var / "redis") == pid
        time.sleep(0.1)
        assert embedded_redis_running(var / "redis") is None
