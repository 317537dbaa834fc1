"""Shared set-up for control-plane benchmarks: a throwaway database on real PostgreSQL, unique names.

Import this module before Django: it sets the environment, creates ``cp_bench_<id>``,
and registers a clean-up that drops that database and every role the run created.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

RUN_ID = secrets.token_hex(3)
SERVER_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB_NAME = f"cp_bench_{RUN_ID}"
ROLE_PREFIX = f"tb{RUN_ID}_"
TMP = Path(tempfile.mkdtemp(prefix=f"cp-bench-{RUN_ID}-"))

os.environ.update(
    DJANGO_SETTINGS_MODULE="controlplane.settings",
    DATABASE_URL=SERVER_URL.rsplit("/", 1)[0] + "/" + DB_NAME,
    TENANT_NAME_PREFIX=ROLE_PREFIX,
    LOCAL_VOLUME_ROOT=str(TMP / "volumes"),
    LOCAL_OBJECTSTORE_ROOT=str(TMP / "objectstore"),
    CONTROLPLANE_VAR_DIR=str(TMP / "var"),
    CELERY_TASK_DEFAULT_QUEUE=f"cp-bench-{RUN_ID}",
    LOG_LEVEL="WARNING",
)
os.environ.setdefault("PROVISIONING_RUNTIME_DRIVER", "deferred")
if not os.environ.get("CELERY_BROKER_URL"):
    os.environ["CELERY_FILESYSTEM_BROKER_DIR"] = str(TMP / "broker")

with psycopg.connect(SERVER_URL, autocommit=True) as _conn:
    _conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))


def _instance_users() -> list[str]:
    """The sandbox users (one machine-wide Unix user per sandboxed tenant) this run's volumes recorded."""
    try:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            rows = conn.execute("SELECT details->>'os_user' FROM provisioning_provisionedresource "
                                "WHERE kind = 'volume' AND details ? 'os_user'").fetchall()
    except psycopg.Error:  # no such table: the run never migrated
        return []
    return [name for (name,) in rows if name]


def _cleanup() -> None:
    for user in _instance_users():  # users are machine-wide like roles: never leave this run's behind
        subprocess.run(["userdel", user], capture_output=True, check=False)
        subprocess.run(["groupdel", user], capture_output=True, check=False)
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DB_NAME,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (ROLE_PREFIX + "%",)).fetchall()
        for (role,) in roles:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    shutil.rmtree(TMP, ignore_errors=True)


atexit.register(_cleanup)


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    """(p50, p95) in milliseconds."""
    ordered = sorted(samples_s)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered) * 1000, p95 * 1000
