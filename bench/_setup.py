"""Shared set-up for control-plane benchmarks: a throwaway database on real PostgreSQL, unique names, clean-up.

Import this module before Django: it sets the environment (this run's database, role prefix, directories, Celery
queue, heartbeat and cache key prefixes; the broker is the machine's Redis unless CELERY_BROKER_URL says
otherwise), creates ``cp_bench_<id>``, and registers a clean-up that stops this run's agent-hosts, drops that
database and every role the run created, and removes this run's keys from Redis. Each clean-up step runs
whatever the others did, and none of them hides the error a bench ended with.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path

import psutil
import psycopg
from psycopg import sql

from bench._run import Cleanup

RUN_ID = secrets.token_hex(3)
SERVER_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB_NAME = f"cp_bench_{RUN_ID}"
ROLE_PREFIX = f"tb{RUN_ID}_"
TMP = Path(tempfile.mkdtemp(prefix=f"cp-bench-{RUN_ID}-"))
QUEUE = f"cp-bench-{RUN_ID}"

os.environ.update(
    DJANGO_SETTINGS_MODULE="controlplane.settings",
    DATABASE_URL=SERVER_URL.rsplit("/", 1)[0] + "/" + DB_NAME,
    TENANT_NAME_PREFIX=ROLE_PREFIX,
    LOCAL_VOLUME_ROOT=str(TMP / "volumes"),
    LOCAL_OBJECTSTORE_ROOT=str(TMP / "objectstore"),
    CONTROLPLANE_VAR_DIR=str(TMP / "var"),
    CELERY_TASK_DEFAULT_QUEUE=QUEUE,
    HEARTBEAT_KEY_PREFIX=f"cp-bench-{RUN_ID}:hb",
    CACHE_KEY_PREFIX=f"cp-bench-{RUN_ID}",
    LOG_LEVEL="WARNING",
)
os.environ.setdefault("PROVISIONING_RUNTIME_DRIVER", "deferred")
# Every server a bench provisions onto (the machine's, or a private one from bench/_pg.py) trusts 127.0.0.1, so
# provisioning needs the override it refuses such a server without (a test server only; recorded per resource).
os.environ.setdefault("TENANT_DATABASE_ALLOW_INSECURE_AUTH", "true")
# The anchors call an instance directly (signed as the control plane signs), which an instance in a network
# namespace of its own (the default `auto`, where bwrap and socat are installed) does not allow; and a volume image
# (LOCAL_VOLUME_QUOTA=auto) would stay mounted under this run's temporary directory. Benches measure the instance on
# the machine's network with a plain directory unless told otherwise (e.g. LOCAL_INSTANCE_NETWORK=isolated to price
# the relays), like the test suite (tests/conftest.py).
os.environ.setdefault("LOCAL_INSTANCE_NETWORK", "shared")
os.environ.setdefault("LOCAL_VOLUME_QUOTA", "off")
if not os.environ.get("CELERY_BROKER_URL"):
    os.environ["CELERY_BROKER_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

try:
    with psycopg.connect(SERVER_URL, autocommit=True) as _conn:
        _conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
except BaseException:  # nothing else exists yet, and the clean-up below is not registered
    shutil.rmtree(TMP, ignore_errors=True)
    raise


def stop_hosts() -> int:
    """SIGKILL every process of this run's instances (agent-hosts and their sandboxes: their AGENT_VOLUME is under
    this run's directory); returns how many. Needs no database row, so it works whatever state a bench left."""
    root, killed = str(TMP) + os.sep, 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("AGENT_VOLUME", "").startswith(root):
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
        except (psutil.Error, ProcessLookupError):
            continue
    return killed


def _instance_users() -> list[str]:
    """The sandbox users (one machine-wide Unix user per sandboxed tenant) this run's volumes recorded."""
    try:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            rows = conn.execute("SELECT details->>'os_user' FROM provisioning_provisionedresource "
                                "WHERE kind = 'volume' AND details ? 'os_user'").fetchall()
    except psycopg.Error:  # no such table: the run never migrated
        return []
    return [name for (name,) in rows if name]


def _drop_users(users: list[str]) -> None:
    for user in users:  # users are machine-wide like roles: never leave this run's behind
        subprocess.run(["userdel", user], capture_output=True, check=False)
        subprocess.run(["groupdel", user], capture_output=True, check=False)


def _drop_database_and_roles() -> None:
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DB_NAME,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (ROLE_PREFIX + "%",)).fetchall()
        for (role,) in roles:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _forget_redis_keys() -> None:
    """This run's heartbeats, cache entries and queue: they would outlive it in the machine's Redis."""
    url = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith(("redis://", "rediss://")):
        return
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"cp-bench-{RUN_ID}:*", count=5000):  # heartbeats and cache entries
        client.delete(key)
    client.delete(QUEUE, f"_kombu.binding.{QUEUE}", f"_kombu.binding_permanent.{QUEUE}")


def _cleanup() -> None:
    users = _instance_users()  # read before the database goes
    with Cleanup() as steps:
        steps.add("remove the temporary directory", shutil.rmtree, TMP, True)
        steps.add("forget this run's Redis keys", _forget_redis_keys)
        steps.add("drop the database and roles", _drop_database_and_roles)
        steps.add("remove sandbox users", _drop_users, users)
        steps.add("stop this run's agent-hosts", stop_hosts)  # first: they hold connections and files


atexit.register(_cleanup)


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    """(p50, p95) in milliseconds."""
    ordered = sorted(samples_s)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered) * 1000, p95 * 1000
