"""Fixtures for the agent_runtime tests: a throw-away database + tenant role + schema per test (or per
module), real sink processes, and a helper that runs real agent-host processes."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.effects.config import adapter_from_spec, payments_api_spec
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.host.runner import Runtime
from agent_runtime.state.migrations import migrate
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from tests.pgbouncer import Bouncer as SharedBouncer
from tests.pgbouncer import start_pgbouncer as start_shared_pgbouncer
from tests.runtime import harness
from tests.runtime.harness import HostRunner, Proc, TenantDB, create_tenant_db, drop_tenant_db, make_env, start_peer

__all__ = ["ADMIN_DSN", "ROOT", "HostRunner", "Proc", "Sinks", "TenantDB", "make_env", "payment_adapter",
           "start_pgbouncer", "start_sinks"]

ROOT = harness.ROOT
ADMIN_DSN = harness.admin_dsn()


@pytest.fixture(scope="session", autouse=True)
def _session_cleanup() -> Iterator[None]:
    """Shadows the control plane's Django session fixture: these tests need no Django; every fixture
    below cleans up its own databases, roles and processes."""
    yield


def _create_tenant_db() -> TenantDB:
    return create_tenant_db(ADMIN_DSN)


def _drop_tenant_db(t: TenantDB) -> None:
    drop_tenant_db(t, ADMIN_DSN)


@pytest.fixture
def tenant_db() -> Iterator[TenantDB]:
    t = _create_tenant_db()
    try:
        yield t
    finally:
        _drop_tenant_db(t)


@pytest.fixture(scope="module")
def module_tenant_db() -> Iterator[TenantDB]:
    t = _create_tenant_db()
    try:
        yield t
    finally:
        _drop_tenant_db(t)


@pytest.fixture
def conn(tenant_db: TenantDB) -> Iterator[psycopg.Connection]:
    c = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    migrate(c, tenant_db.schema)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def host_env(tenant_db: TenantDB, tmp_path: Path) -> dict[str, str]:
    return make_env(tenant_db, tmp_path)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[HostRunner]:
    runner = HostRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


@dataclass
class Sinks:
    smtp_url: str
    payments_url: str
    smtp_log: Path
    procs: list[Proc]
    # Outage switches, absent by default: while the file exists the payments peer answers 503 to everything,
    # and the SMTP relay logs each message then drops the connection before its 250.
    payments_fail_file: Path
    smtp_drop_file: Path

    def emails(self) -> list[dict[str, Any]]:
        if not self.smtp_log.exists():
            return []
        return [json.loads(line) for line in self.smtp_log.read_text().splitlines() if line]

    def stop(self) -> None:
        for p in self.procs:
            p.stop()

    def payment_stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.payments_url + "/stats", timeout=5) as resp:
            return dict(json.loads(resp.read()))


def start_sinks(tmp: Path, dedupe: bool = True, payments_env: dict[str, str] | None = None,
                smtp_env: dict[str, str] | None = None) -> Sinks:
    """The SMTP relay and the payments peer as processes; `payments_env`/`smtp_env` set their switches."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs, ports = [], []
    fail_file, drop_file = tmp / "payments.fail", tmp / "smtp.drop"
    for mod, extra in (("smtp", {"AGENT_SMTP_SINK_LOG": str(tmp / "smtp.jsonl"),
                                 "AGENT_SMTP_SINK_DROP_FILE": str(drop_file), **(smtp_env or {})}),
                       ("payments", {"AGENT_PAYMENTS_DEDUPE": "1" if dedupe else "0",
                                     "AGENT_PAYMENTS_FAIL_FILE": str(fail_file), **(payments_env or {})})):
        proc, port = start_peer(mod, {**env, **extra}, tmp)
        procs.append(proc)
        ports.append(port)
    return Sinks(f"smtp://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}", tmp / "smtp.jsonl", procs,
                 fail_file, drop_file)


@pytest.fixture
def nodedupe(tmp_path: Path) -> Iterator[Sinks]:
    """Peers whose payment provider ignores Idempotency-Key: only the ledger and the lookup stand in the way."""
    s = start_sinks(tmp_path / "nodedupe", dedupe=False)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def sinks(tmp_path: Path) -> Iterator[Sinks]:
    s = start_sinks(tmp_path / "sinks")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def runtime(conn: psycopg.Connection, tmp_path: Path, sinks: Sinks) -> Runtime:
    """An in-process runtime on the tenant schema with real sinks and an in-memory credential source."""
    tenant_id = str(uuid.uuid4())
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects" / tenant_id), os.urandom(32), tenant_id)
    creds = InMemoryCredentialSource({"smtp": "smtp-password", "mail-forwarding": "fwd-token"})
    (tmp_path / "volume").mkdir(mode=0o700, exist_ok=True)
    return Runtime(conn=conn, tenant_id=tenant_id, volume=tmp_path / "volume", store=store, credentials=creds,
                   effects={"email": SmtpEffect(sinks.smtp_url), "payment": payment_adapter(sinks.payments_url)})


def payment_adapter(base_url: str, **overrides: Any) -> Any:
    """The Stripe-style charges adapter the host builds for AGENT_PAYMENTS_URL, declaring the peer's search as it
    is (immediate) unless `lookup_consistency_s` says otherwise (a peer started with AGENT_PAYMENTS_SEARCH_LAG_S)."""
    return adapter_from_spec("payment", {**payments_api_spec(base_url, 0.0), **overrides}, None)


@dataclass
class Bouncer:
    """tests/pgbouncer.py's PgBouncer (transaction mode) in front of one tenant database, its role in the auth
    file: the runtime's tests need no auth_query (tests/provisioning/test_pooled_instances.py uses that)."""

    bouncer: SharedBouncer

    @property
    def port(self) -> int:
        return self.bouncer.port

    def stop(self) -> None:
        self.bouncer.stop()

    def dsn(self, t: TenantDB) -> str:
        params = psycopg.conninfo.conninfo_to_dict(t.dsn)
        return self.bouncer.dsn(t.dbname, str(params["user"]), str(params["password"]))


def start_pgbouncer(t: TenantDB, tmp: Path, settings: dict[str, str | int | float] | None = None) -> Bouncer:
    server = psycopg.conninfo.conninfo_to_dict(t.dsn)
    host, server_port = str(server.get("host") or "127.0.0.1"), int(server.get("port") or 5432)
    if host.startswith("/"):  # the embedded server listens on a socket under a 0700 directory postgres can't enter
        host, server_port = "127.0.0.1", _tcp_relay(Path(host) / f".s.PGSQL.{server_port}")
    try:
        shared = start_shared_pgbouncer(server_host=host, server_port=server_port, databases=[t.dbname],
                                        name=tmp.name, users={str(server["user"]): str(server["password"])},
                                        settings=settings)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return Bouncer(shared)


def _tcp_relay(unix_path: Path) -> int:
    """Forward a loopback TCP port to a Unix socket (threads, for the test's lifetime); return the port."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(str(unix_path))
            threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])
