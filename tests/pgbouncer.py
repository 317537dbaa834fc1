"""A real PgBouncer (Debian's package) in front of a PostgreSQL server, for tests and benchmarks.

Two ways to authenticate clients:
- ``auth_file`` only (``users``: name -> password, ``auth_type = plain``): what the runtime's own tests use, with
  one tenant role written into the file;
- ``auth_query`` (``auth_user`` set, ``auth_type = scram-sha-256``): PgBouncer asks the server for each role's
  SCRAM verifier through ``auth_user`` and the operator's SECURITY DEFINER lookup function
  (``install_auth_query``); tenant roles appear in no file, and PgBouncer logs into the server with SCRAM
  pass-through. This is the production set-up docs/production.md describes.

The process runs as ``postgres`` (PgBouncer refuses root), from a directory of its own under /tmp; ``restart``
starts it again on the same port with the same configuration (fault tests). Django-free: the runtime's tests
import it too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from controlplane.pgbouncer import AUTH_FUNCTION_SQL, install_auth_query, pgbouncer_binary, pgbouncer_config
from controlplane.ports import free_port

__all__ = ["AUTH_FUNCTION_SQL", "Bouncer", "install_auth_query", "pgbouncer_binary", "restart_postgres",
           "start_pgbouncer"]


@dataclass
class Bouncer:
    """A running PgBouncer; ``admin`` reaches its console (SHOW SERVERS, SHOW POOLS) as ``admin_user``."""

    port: int
    workdir: Path
    admin_user: str
    admin_password: str = field(repr=False)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def ini(self) -> Path:
        return self.workdir / "pgbouncer.ini"

    def _launch(self) -> None:
        out = (self.workdir / "stdout.log").open("ab")
        self.proc = subprocess.Popen([pgbouncer_binary(), "-u", "postgres", str(self.ini)], stdout=out,
                                     stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()[-3000:]}") from None
                time.sleep(0.05)

    def log(self) -> str:
        parts = [p.read_text(errors="replace") for p in (self.workdir / "stdout.log", self.workdir / "pgbouncer.log")
                 if p.exists()]
        return "\n".join(parts)

    def kill(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        """Send ``sig`` (SIGTERM: PgBouncer 1.18's immediate shutdown; SIGKILL: no shutdown at all), wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)

    def restart(self, sig: int = signal.SIGTERM, down_s: float = 0.0) -> None:
        """Kill it with ``sig``, stay down ``down_s`` seconds, start it again on the same port and files."""
        self.kill(sig)
        (self.workdir / "pgbouncer.pid").unlink(missing_ok=True)  # a SIGKILL leaves it behind
        time.sleep(down_s)
        self._launch()
        self.restarts += 1

    def stop(self) -> None:
        self.kill(signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def dsn(self, dbname: str, user: str, password: str) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                                              password=password)

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Rows of an admin console command (simple protocol: the console has no extended one)."""
        with psycopg.connect(self.dsn("pgbouncer", self.admin_user, self.admin_password), autocommit=True,
                             prepare_threshold=None) as conn:
            cur = conn.cursor()
            cur.execute(command.encode(), prepare=False)  # type: ignore[call-overload]
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def server_pids(self, user: str | None = None) -> set[int]:
        """Backend pids of PgBouncer's server connections (all, or ``user``'s pool)."""
        return {int(r["remote_pid"]) for r in self.admin("SHOW SERVERS")
                if r.get("remote_pid") and (user is None or r["user"] == user)}


def start_pgbouncer(*, server_host: str, server_port: int, databases: list[str], name: str = "",
                    users: Mapping[str, str] | None = None, auth_user: tuple[str, str] | None = None,
                    settings: Mapping[str, str | int | float] | None = None) -> Bouncer:
    """Start PgBouncer in transaction mode in front of ``server_host:server_port``'s ``databases``.

    ``auth_user`` (name, password): client roles are looked up through auth_query (``install_auth_query`` must
    have run on each database) with SCRAM on both sides; else ``users`` are the only roles it admits, with
    plain passwords from its auth_file. ``settings`` override the [pgbouncer] defaults below (pool sizes,
    timeouts); ``server_login_retry`` is 1 s, not 15, so a restarted server is found again within a second.
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"pgbouncer-{name}-" if name else "pgbouncer-"))
    workdir.chmod(0o755)
    port = free_port()
    admin_user, admin_password = "bouncer_admin", os.urandom(12).hex()
    entries = {admin_user: admin_password, **(users or {})}
    if auth_user is not None:
        entries[auth_user[0]] = auth_user[1]
    ini, userlist = pgbouncer_config(workdir=workdir, port=port, server_host=server_host, server_port=server_port,
                                     databases=databases, users=entries,
                                     auth_user=auth_user[0] if auth_user is not None else None,
                                     settings={"admin_users": admin_user, **(settings or {})})
    (workdir / "userlist.txt").write_text(userlist)
    (workdir / "pgbouncer.ini").write_text(ini)
    for path in (workdir / "userlist.txt", workdir / "pgbouncer.ini"):
        path.chmod(0o600)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        for path in (workdir, workdir / "userlist.txt", workdir / "pgbouncer.ini"):
            os.chown(path, user.pw_uid, user.pw_gid)
    bouncer = Bouncer(port=port, workdir=workdir, admin_user=admin_user, admin_password=admin_password)
    bouncer._launch()
    return bouncer


def restart_postgres(admin_dsn: str) -> None:
    """``pg_ctl restart -m fast`` of the server ``admin_dsn`` (a superuser's) reaches, with its own options."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
        version = conn.info.server_version // 10000
    assert row is not None
    pg_ctl = Path(f"/usr/lib/postgresql/{version}/bin/pg_ctl")
    as_postgres: dict[str, Any] = {"user": "postgres"} if os.geteuid() == 0 else {}
    subprocess.run([str(pg_ctl), "-D", row[0], "-w", "-m", "fast", "-l", str(Path(row[0]).parent / "log"),
                    "restart"], check=True, capture_output=True, timeout=60, **as_postgres)
