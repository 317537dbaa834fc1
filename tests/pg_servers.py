"""PostgreSQL servers that tests start themselves: Debian's PostgreSQL 15 with SCRAM on every line.

The machine's own server trusts local logins, so a test that must see a password refused starts one of
these (tests/provisioning/test_pg_auth_boundaries.py, tests/provisioning/test_isolation_attacks.py). Each has its own
data directory, port and superuser password, and is stopped and removed afterwards.

``running_replicated_pair`` starts a primary and a streaming standby cloned from it with ``pg_basebackup -R``
(tests/provisioning/test_standby_failover.py): the standby is named in the primary's ``synchronous_standby_names`` with
``synchronous_commit = on``, or left asynchronous, so a test can show which commits survive losing the primary.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg import sql

from controlplane.ports import free_port

__all__ = ["DEBIAN_BIN", "Server", "ReplicatedPair", "running_scram_server", "running_replicated_pair"]

DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres() -> dict[str, str]:
    return {"user": "postgres"} if os.geteuid() == 0 else {}  # PostgreSQL refuses to run as root


@dataclass(frozen=True)
class Server:
    port: int
    password: str

    def passfile_dsn(self, dbname: str = "tenantdb") -> str:
        """The DSN as an operator records it for a ``DatabaseServer``: the password in a 0600 libpq passfile."""
        passfile = Path(tempfile.gettempdir()) / f"cp-pgpass-{self.port}-{dbname}"
        passfile.write_text(f"127.0.0.1:{self.port}:{dbname}:postgres:{self.password}\n")
        passfile.chmod(0o600)
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres passfile={passfile}"

    def url(self, dbname: str, user: str = "postgres", password: str | None = None) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                                              password=self.password if password is None else password)


def _initdb(base: Path) -> tuple[Path, str]:
    """A fresh SCRAM-only cluster under ``base``; returns its data directory and the superuser's password."""
    if not (DEBIAN_BIN / "initdb").exists():
        pytest.skip("needs PostgreSQL 15's server binaries in /usr/lib/postgresql/15/bin")
    data, pwfile, password = base / "data", base / "pw", secrets.token_urlsafe(18)
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    subprocess.run([DEBIAN_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=scram-sha-256", f"--pwfile={pwfile}"],
                   check=True, capture_output=True, **_as_postgres())
    return data, password


def _pg_ctl_start(data: Path, base: Path, port: int, *settings: str) -> None:
    options = " ".join([f"-c listen_addresses=127.0.0.1 -p {port} -k {base}", *(f"-c {s}" for s in settings)])
    subprocess.run([DEBIAN_BIN / "pg_ctl", "-D", data, "-w", "-l", base / "log", "-o", options, "start"],
                   check=True, capture_output=True, **_as_postgres())


def _pg_ctl_stop(data: Path) -> None:
    subprocess.run([DEBIAN_BIN / "pg_ctl", "-D", data, "-w", "-m", "immediate", "stop"], capture_output=True,
                   **_as_postgres())


@contextlib.contextmanager
def running_scram_server() -> Iterator[Server]:
    """Debian's PostgreSQL 15, initdb --auth=scram-sha-256, its superuser's password set, databases
    ``tenantdb`` and ``controlplane`` (standing for the control plane's own) created."""
    base = Path(tempfile.mkdtemp(prefix="cp-scram-"))
    data, password = _initdb(base)
    port = free_port()
    _pg_ctl_start(data, base, port)
    server = Server(port=port, password=password)
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE tenantdb")
        conn.execute("CREATE DATABASE controlplane")  # stands for the control plane's own database
    try:
        yield server
    finally:
        _pg_ctl_stop(data)
        shutil.rmtree(base, ignore_errors=True)


STANDBY_NAME = "standby1"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass(frozen=True)
class ReplicatedPair:
    """A primary and its streaming standby (same superuser password: the standby is a byte copy)."""

    primary: Server
    standby: Server
    primary_data: Path
    standby_data: Path
    synchronous: bool

    def primary_pids(self) -> list[int]:
        """The primary's postmaster and every process it started (backends, walsender, checkpointer)."""
        try:
            postmaster = psutil.Process(int((self.primary_data / "postmaster.pid").read_text().split()[0]))
            return [postmaster.pid, *(child.pid for child in postmaster.children(recursive=True))]
        except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
            return []

    def kill_primary(self) -> float:
        """SIGKILL the primary's postmaster and all its processes at once: a lost machine, not a shutdown
        (``pg_ctl -m immediate`` would still tell the walsender to stop; nothing here gets to say goodbye).
        Returns the ``time.monotonic()`` of the kill; returns once every one of them is gone."""
        procs = []
        for pid in self.primary_pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        killed_at = time.monotonic()
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        deadline = killed_at + 10
        while alive := [p.pid for p in procs if _alive(p)]:  # a zombie is dead: its reaper may take seconds
            if time.monotonic() > deadline:
                raise AssertionError(f"the primary's processes {alive} survived SIGKILL")
            time.sleep(0.01)
        return killed_at

    def stop_streaming(self) -> None:
        """Stop the standby's walreceiver (``primary_conninfo`` emptied and reloaded) and wait until it is gone:
        from then on the standby receives nothing, so a commit on the primary exists only there. Pausing replay
        (``pg_wal_replay_pause()``) would not do: WAL already received is replayed at promotion."""
        with psycopg.connect(self.standby.url("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise AssertionError("the standby's walreceiver did not stop")
                time.sleep(0.05)

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees the standby streaming (and, when synchronous, as its sync standby)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.primary.url("postgres"), autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                                   (STANDBY_NAME,)).fetchone()
                if row == ("streaming", wanted):
                    return
                time.sleep(0.05)
        raise AssertionError(f"the standby is not streaming ({wanted}) after {timeout}s")


@contextlib.contextmanager
def running_replicated_pair(*, synchronous: bool = True) -> Iterator[ReplicatedPair]:
    """A primary (``wal_level = replica``, a SCRAM ``replicator`` role) and a standby made from it with
    ``pg_basebackup -R`` through a physical replication slot, both on 127.0.0.1 on their own ports.

    ``synchronous``: the primary names the standby in ``synchronous_standby_names`` with ``synchronous_commit =
    on``: a commit returns once the standby has flushed its WAL to disk, so a promoted standby replays every
    acknowledged commit. ``on`` rather than ``remote_apply``: nothing reads from the standby, and promotion
    replays all flushed WAL before it accepts a connection, so waiting for the apply would only add latency.
    Off: the standby streams asynchronously and may lag; the tail is lost with the primary.
    """
    base = Path(tempfile.mkdtemp(prefix="cp-pair-"))
    primary_base, standby_base = base / "primary", base / "standby"
    primary_base.mkdir()
    standby_base.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        shutil.chown(standby_base, "postgres", "postgres")
    primary_data, password = _initdb(primary_base)
    primary_port, standby_port = free_port(), free_port()
    sync = [f"synchronous_standby_names={STANDBY_NAME}", "synchronous_commit=on"] if synchronous else []
    _pg_ctl_start(primary_data, primary_base, primary_port, "wal_level=replica", "max_wal_senders=4",
                  "max_replication_slots=4", *sync)
    primary = Server(port=primary_port, password=password)
    replicator_password = secrets.token_urlsafe(18)
    standby_data = standby_base / "data"
    try:
        with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
            # Until the standby exists a synchronous commit would wait for it: set up without waiting.
            conn.execute("SET synchronous_commit = local")
            conn.execute(sql.SQL("CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD {}").format(
                sql.Literal(replicator_password)))
            conn.execute("CREATE DATABASE tenantdb")
            conn.execute("CREATE DATABASE controlplane")
        # pg_basebackup -R writes the primary_conninfo it connected with (the password included, from
        # PGPASSWORD) into the copy's postgresql.auto.conf and standby.signal next to it.
        subprocess.run([DEBIAN_BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary_port), "-U", "replicator",
                        "-D", standby_data, "-R", "-X", "stream", "-C", "-S", STANDBY_NAME, "--checkpoint=fast"],
                       check=True, capture_output=True, env={**os.environ, "PGPASSWORD": replicator_password},
                       **_as_postgres())
        # cluster_name is the walreceiver's application_name: what synchronous_standby_names matches.
        _pg_ctl_start(standby_data, standby_base, standby_port, f"cluster_name={STANDBY_NAME}",
                      "hot_standby=on")
        pair = ReplicatedPair(primary=primary, standby=Server(port=standby_port, password=password),
                              primary_data=primary_data, standby_data=standby_data, synchronous=synchronous)
        pair.wait_streaming()
        yield pair
    finally:
        _pg_ctl_stop(standby_data)
        _pg_ctl_stop(primary_data)
        shutil.rmtree(base, ignore_errors=True)
