"""Driving the runtime from outside, without pytest: throw-away tenant databases and roles, the local provider
peers, real agent-host processes, and the PostgreSQL client tools.

The crash kit (`scripts/crash_kit.py`) runs on this module at run time; tests can too. Nothing here imports
pytest or Django, and every helper that starts something hands back an object that stops it
(`tests/runtime/conftest.py` builds its fixtures on them).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from agent_runtime.state.migrations import BACKFILLS, MIGRATIONS, VERSION_TABLE

__all__ = ["ROOT", "HostRunner", "Peers", "Proc", "TenantDB", "add_tenant_schema", "admin_dsn", "create_tenant_db",
           "drop_tenant_db", "dump_schema", "make_env", "pg_tool", "request_queued_at", "restore_schema",
           "schema_at_version", "start_peer", "start_peers"]

ROOT = Path(__file__).resolve().parents[2]


def admin_dsn() -> str:
    """The PostgreSQL server the tests use (DATABASE_URL, or the embedded one the settings would start), on its
    maintenance database. Read without Django: the runtime and these helpers never import it."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        from controlplane.embedded_pg import embedded_database_url  # stdlib + pgserver only

        var = Path(os.environ.get("CONTROLPLANE_VAR_DIR", str(ROOT / "var"))).resolve()
        url = embedded_database_url(var / "pgdata")
    return psycopg.conninfo.make_conninfo(url, dbname="postgres")


@dataclass(frozen=True)
class TenantDB:
    dsn: str  # the tenant role's DSN (no other privileges)
    admin_dsn: str  # superuser DSN on the same database
    schema: str
    role: str
    dbname: str


def create_tenant_db(admin: str, prefix: str = "rt") -> TenantDB:
    """A database, a login role and a schema it owns, named `<prefix>_<8 hex>` (the schema `t_<8 hex>`)."""
    tag = uuid.uuid4().hex[:8]
    dbname, role, schema = f"{prefix}_{tag}", f"{prefix}_{tag}", f"t_{tag}"
    password = uuid.uuid4().hex
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        # Its own CONNECT, not PUBLIC's: a provisioning test on the same server may revoke PUBLIC's from every
        # database at any moment (`postgres_schema`'s hardening of the embedded server), this one included.
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(dbname),
                                                                          sql.Identifier(role)))
    admin_db = psycopg.conninfo.make_conninfo(admin, dbname=dbname)
    with psycopg.connect(admin_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role)))
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA public FROM PUBLIC"))
        conn.execute(sql.SQL("ALTER ROLE {} SET search_path TO {}").format(sql.Identifier(role),
                                                                           sql.Identifier(schema)))
    dsn = psycopg.conninfo.make_conninfo(admin_db, user=role, password=password)
    return TenantDB(dsn=dsn, admin_dsn=admin_db, schema=schema, role=role, dbname=dbname)


def add_tenant_schema(t: TenantDB, prefix: str = "rtb") -> TenantDB:
    """Another tenant in `t`'s database, made as `create_tenant_db` makes one: its own login role and a schema it
    owns with no USAGE for PUBLIC. Dropped with that database by `drop_tenant_db` (its role as well)."""
    tag = uuid.uuid4().hex[:8]
    role, schema, password = f"{prefix}_{tag}", f"t_{tag}", uuid.uuid4().hex
    with psycopg.connect(t.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role)))
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("ALTER ROLE {} SET search_path TO {}").format(sql.Identifier(role),
                                                                           sql.Identifier(schema)))
    dsn = psycopg.conninfo.make_conninfo(t.admin_dsn, user=role, password=password)
    return TenantDB(dsn=dsn, admin_dsn=t.admin_dsn, schema=schema, role=role, dbname=t.dbname)


def schema_at_version(conn: psycopg.Connection, version: int) -> None:
    """Bring the empty schema of ``conn`` to ``version`` as a runtime of that version left it (its migrations and
    backfills, no later one), in the caller's transaction: the starting point of a test of `migrate`."""
    conn.execute(sql.SQL("CREATE TABLE {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL"
                         " DEFAULT now())").format(sql.Identifier(VERSION_TABLE)))
    for v in range(1, version + 1):
        conn.execute(MIGRATIONS[v])  # type: ignore[arg-type]
        if v in BACKFILLS:
            BACKFILLS[v](conn)
        conn.execute(sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(sql.Identifier(VERSION_TABLE)), (v,))


def drop_tenant_db(t: TenantDB, admin: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(t.dbname)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(t.role)))


def make_env(t: TenantDB, base: Path, **extra: str) -> dict[str, str]:
    """agent-host's environment for tenant `t`, its volume and object store under `base`."""
    tenant_id = str(uuid.uuid4())
    volume = base / "volume"
    volume.mkdir(mode=0o700, parents=True, exist_ok=True)
    objects = base / "objects" / "tenants" / tenant_id
    objects.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({
        "AGENT_TENANT_ID": tenant_id, "AGENT_SCHEMA": t.schema, "AGENT_DATABASE_URL": t.dsn,
        "AGENT_VOLUME": str(volume), "AGENT_OBJECTSTORE_URL": f"file://{objects}/",
        "AGENT_OBJECT_KEY": base64.b64encode(os.urandom(32)).decode(),
        "AGENT_POLL_INTERVAL_S": "0.05", "AGENT_STEP_TIMEOUT_S": "5", "AGENT_GRACE_PERIOD_S": "3",
        # This checkout's examples first: a worktree shares its venv's editable install of another checkout's.
        "AGENT_CREDENTIAL_SMTP": "smtp-password", "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples"))),
        # The payments peer's search finds a charge the moment it is made, unless started with a search lag.
        "AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S": "0",
    })
    env.update(extra)
    return env


class Proc:
    """A real child process with its output in a file. Every live one is in `Proc.live`, so whoever started
    them can stop all of them at once (`Proc.stop_live()`), on an error or a Ctrl-C too."""

    live: set[Proc] = set()
    _lock = threading.Lock()

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.fh = log_path.open("ab")
        # Its own session: a Ctrl-C in the terminal reaches only the parent, which stops its children in order.
        self.p = subprocess.Popen(args, env=env, stdout=self.fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                  start_new_session=True)
        with Proc._lock:
            Proc.live.add(self)

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def wait(self, timeout: float = 10) -> int:
        return self.p.wait(timeout=timeout)

    def output(self) -> str:
        self.fh.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)  # a stopped process cannot die of SIGKILL until continued
            self.p.kill()
            self.p.wait(timeout=10)
        self.fh.close()
        with Proc._lock:
            Proc.live.discard(self)

    @classmethod
    def stop_live(cls) -> None:
        for proc in list(cls.live):
            proc.stop()


class HostRunner:
    """Starts agent-host processes (`python -m agent_runtime.host`), each logging to its own file."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.n = 0

    def start(self, env: dict[str, str]) -> Proc:
        self.n += 1
        Path(env["AGENT_VOLUME"], ".host", "http-port").unlink(missing_ok=True)
        proc = Proc([sys.executable, "-m", "agent_runtime.host"], env, self.tmp / f"host-{self.n}.log")
        self.procs.append(proc)
        return proc

    @staticmethod
    def port(env: dict[str, str], timeout: float = 15) -> int:
        port_file = Path(env["AGENT_VOLUME"], ".host", "http-port")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists():
                return int(port_file.read_text())
            time.sleep(0.02)
        raise RuntimeError("agent-host never wrote its http-port file")

    def get(self, env: dict[str, str], path: str, timeout: float = 5) -> tuple[int, dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port(env)}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_ready(self, env: dict[str, str], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        host = self.procs[-1]
        while time.monotonic() < deadline:
            if not host.alive():
                raise RuntimeError(f"agent-host exited with {host.p.returncode} before it was ready:\n"
                                   + host.output()[-2000:])
            try:
                code, body = self.get(env, "/readyz")
                if code == 200:
                    return body
            except (OSError, http.client.HTTPException, ValueError, RuntimeError):  # not answering (yet)
                pass
            time.sleep(0.05)
        raise RuntimeError("agent-host never became ready:\n" + host.output()[-2000:])

    def stop_all(self) -> None:
        for p in self.procs:
            p.stop()


@dataclass
class Peers:
    """The SMTP relay and the payments provider of `agent_examples.peers`, as real processes."""

    smtp_url: str
    payments_url: str
    smtp_log: Path
    smtp: Proc
    payments: Proc

    def emails(self) -> list[dict[str, Any]]:
        if not self.smtp_log.exists():
            return []
        return [json.loads(line) for line in self.smtp_log.read_text().splitlines() if line]

    def payment_stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.payments_url + "/stats", timeout=5) as resp:  # noqa: S310 - loopback
            return dict(json.loads(resp.read()))

    def stop(self) -> None:
        self.smtp.stop()
        self.payments.stop()


def start_peer(module: str, env: dict[str, str], tmp: Path) -> tuple[Proc, int]:
    """`python -m agent_examples.peers.<module>` with `env`, once it has announced its port; (process, port)."""
    port_file = tmp / f"{module}.port"
    proc = Proc([sys.executable, "-m", f"agent_examples.peers.{module}"],
                {**env, "AGENT_SINK_PORT_FILE": str(port_file)}, tmp / f"{module}.log")
    deadline = time.monotonic() + 15
    while not port_file.exists():
        if time.monotonic() > deadline or not proc.alive():
            proc.stop()
            raise RuntimeError(f"the {module} peer did not start:\n{proc.output()[-2000:]}")
        time.sleep(0.02)
    return proc, int(port_file.read_text())


def start_peers(tmp: Path, *, dedupe: bool = True, payments_env: dict[str, str] | None = None) -> Peers:
    """Both peers on ephemeral ports; `dedupe=False`: a provider that ignores Idempotency-Key."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    smtp, smtp_port = start_peer("smtp", {**env, "AGENT_SMTP_SINK_LOG": str(tmp / "smtp.jsonl")}, tmp)
    try:
        payments, pay_port = start_peer("payments", {**env, "AGENT_PAYMENTS_DEDUPE": "1" if dedupe else "0",
                                                      **(payments_env or {})}, tmp)
    except BaseException:
        smtp.stop()
        raise
    return Peers(f"smtp://127.0.0.1:{smtp_port}", f"http://127.0.0.1:{pay_port}", tmp / "smtp.jsonl", smtp, payments)


def request_queued_at(port: int) -> bool:
    """True once bytes sent to 127.0.0.1:`port` wait, unread, in the receive queue of the (stopped) server's end
    of a connection: the kernel's own account (/proc/net/tcp), not the peer's, which cannot answer."""
    local = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[3] == "01" and int(fields[4].split(":")[1], 16) > 0:
            return True
    return False


def pg_tool(name: str, admin: str) -> str:
    """The client binary (pg_dump, pg_restore) whose major version matches the server's."""
    with psycopg.connect(admin) as conn:
        major = int(conn.info.server_version) // 10000
    candidates = []
    try:
        import pgserver

        candidates.append(str(Path(pgserver.__file__).parent / "pginstall" / "bin" / name))
    except ImportError:
        pass
    candidates += [f"/usr/lib/postgresql/{major}/bin/{name}", shutil.which(name) or name]
    for path in candidates:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        except OSError:
            continue
        if f" {major}." in out:
            return path
    raise RuntimeError(f"no {name} for PostgreSQL {major} on this machine")


def dump_schema(t: TenantDB, schema: str, path: Path, admin: str) -> None:
    """pg_dump of one schema (custom format), as the superuser: what a backup job archives."""
    subprocess.run([pg_tool("pg_dump", admin), "--format=custom", f"--schema={schema}", f"--file={path}",
                    t.admin_dsn], check=True, capture_output=True, timeout=120)


def restore_schema(t: TenantDB, schema: str, path: Path, admin: str) -> None:
    """Drop the schema and pg_restore it from `path`: what a recovery from that archive does."""
    with psycopg.connect(t.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    subprocess.run([pg_tool("pg_restore", admin), f"--dbname={t.admin_dsn}", str(path)], check=True,
                   capture_output=True, timeout=120)
