"""PostgreSQL servers that tests start themselves: Debian's PostgreSQL 15 with SCRAM on every line.

The machine's own server trusts local logins, so a test that must see a password refused starts one of
these (tests/test_pg_auth_boundaries.py, tests/test_isolation_attacks.py). Each has its own data
directory, port and superuser password, and is stopped and removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

__all__ = ["DEBIAN_BIN", "Server", "running_scram_server"]

DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres() -> dict[str, str]:
    return {"user": "postgres"} if os.geteuid() == 0 else {}  # PostgreSQL refuses to run as root


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Server:
    port: int
    password: str

    def url(self, dbname: str, user: str = "postgres", password: str | None = None) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                                              password=self.password if password is None else password)


@contextlib.contextmanager
def running_scram_server() -> Iterator[Server]:
    """Debian's PostgreSQL 15, initdb --auth=scram-sha-256, its superuser's password set, databases
    ``tenantdb`` and ``controlplane`` (standing for the control plane's own) created."""
    if not (DEBIAN_BIN / "initdb").exists():
        pytest.skip("needs PostgreSQL 15's server binaries in /usr/lib/postgresql/15/bin")
    base = Path(tempfile.mkdtemp(prefix="cp-scram-"))
    data, pwfile, password = base / "data", base / "pw", secrets.token_urlsafe(18)
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    subprocess.run([DEBIAN_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=scram-sha-256", f"--pwfile={pwfile}"],
                   check=True, capture_output=True, **_as_postgres())
    port = _free_port()
    subprocess.run([DEBIAN_BIN / "pg_ctl", "-D", data, "-w", "-l", base / "log", "-o",
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {base}", "start"],
                   check=True, capture_output=True, **_as_postgres())
    server = Server(port=port, password=password)
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE tenantdb")
        conn.execute("CREATE DATABASE controlplane")  # stands for the control plane's own database
    try:
        yield server
    finally:
        subprocess.run([DEBIAN_BIN / "pg_ctl", "-D", data, "-w", "-m", "immediate", "stop"], capture_output=True,
                       **_as_postgres())
        shutil.rmtree(base, ignore_errors=True)


