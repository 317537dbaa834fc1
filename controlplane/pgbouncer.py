"""PgBouncer in transaction mode: the auth_query set-up an operator installs, and the embedded default's own.

Tenant roles never appear in PgBouncer's files: PgBouncer looks a role's SCRAM verifier up through ``auth_user``
and a SECURITY DEFINER function (``install_auth_query``), checks the client's SCRAM proof against it and logs in
to the server with SCRAM pass-through, so no tenant password is written anywhere (docs/production.md, "Pooled
connections"). ``pgbouncer_config`` renders the ini file the tests, the benchmarks and the embedded default use.

``embedded_pgbouncer`` is the local profile's PgBouncer (``EMBEDDED_PGBOUNCER``; ``make demo`` turns it on where
Debian's package is installed): in front of the embedded PostgreSQL's ``tenants`` database, started (or reused)
like the embedded server itself, from any process, under a file lock, and left running for the next one; its
port is picked once and kept in ``var/pgbouncer/port``. As root it runs as pgserver's system user (PgBouncer
refuses root), like the embedded server. Django-free: settings import it before Django is set up.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg import sql

from controlplane.ports import free_port, port_answers

from .embedded_pg import DATABASE_ACL_LOCK, SYSTEM_USER, TENANT_DATABASE, EmbeddedServer, _exclusive, _pg_commands
from .secretfiles import read_or_create_secret

__all__ = ["AUTH_FUNCTION_SQL", "AUTH_QUERY", "AUTH_SCHEMA", "EMBEDDED_AUTH_USER", "embedded_pgbouncer",
           "embedded_pgbouncer_port", "embedded_pgbouncer_running", "embedded_pgbouncer_stop", "install_auth_query",
           "pgbouncer_binary", "pgbouncer_config", "pgbouncer_installed"]

AUTH_SCHEMA = "pgbouncer"  # spelled out in the two statements below
AUTH_QUERY = "SELECT uname, phash FROM pgbouncer.user_lookup($1)"
# The standard lookup, narrowed: never a superuser's verifier (PgBouncer would then log superusers in), and
# EXECUTE for the auth user alone. One copy per database PgBouncer serves (auth_query runs in the client's).
AUTH_FUNCTION_SQL = """
CREATE SCHEMA IF NOT EXISTS pgbouncer;
REVOKE ALL ON SCHEMA pgbouncer FROM PUBLIC;
CREATE OR REPLACE FUNCTION pgbouncer.user_lookup(i_username text, OUT uname text, OUT phash text)
RETURNS record LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
  SELECT usename::text, passwd::text FROM pg_catalog.pg_shadow WHERE usename = i_username AND NOT usesuper
$$;
REVOKE ALL ON FUNCTION pgbouncer.user_lookup(text) FROM PUBLIC;
"""
EMBEDDED_AUTH_USER = "pgbouncer_auth"
_AUTH_PASSWORD_FILE = "pgbouncer-auth-password"  # under var/secrets, like the superuser's


def pgbouncer_installed() -> str | None:
    """The pgbouncer binary's path, or None (Debian's package puts it in /usr/sbin, often not on PATH)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    return binary if Path(binary).exists() else None


def pgbouncer_binary() -> str:
    binary = pgbouncer_installed()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (Debian package pgbouncer; `make system-deps` installs it)")
    return binary


def install_auth_query(admin_dsn: str, *, auth_user: str, auth_password: str) -> None:
    """The operator's part of auth_query, on the database ``admin_dsn`` names: the login role PgBouncer uses
    for lookups (CONNECT on this database, no other privilege) and the SECURITY DEFINER function reading
    pg_shadow. Idempotent. The GRANT rewrites the database's pg_database row, so it takes the lock that
    provisioning's grants on that row take (two at once fail with "tuple concurrently updated")."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (auth_user,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(auth_user),
                                                                           sql.Literal(auth_password)))
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (DATABASE_ACL_LOCK,))
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), sql.Identifier(auth_user)))
        conn.execute(AUTH_FUNCTION_SQL)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(AUTH_SCHEMA),
                                                                      sql.Identifier(auth_user)))
        conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}.user_lookup(text) TO {}").format(
            sql.Identifier(AUTH_SCHEMA), sql.Identifier(auth_user)))


def pgbouncer_config(*, workdir: Path, port: int, server_host: str, server_port: int, databases: list[str],
                     users: Mapping[str, str], auth_user: str | None,
                     settings: Mapping[str, str | int | float] | None = None) -> tuple[str, str]:
    """(pgbouncer.ini, userlist.txt) for transaction mode on 127.0.0.1:``port``.

    ``auth_user``: client roles are looked up through auth_query with SCRAM on both sides (``users`` then holds
    the auth user's and the admin console's entries); None: ``users`` are the only roles admitted, with plain
    passwords. ``server_login_retry`` is 1 s, not 15, so a restarted server is found again within a second.
    """
    config: dict[str, str | int | float] = {
        "listen_addr": "127.0.0.1", "listen_port": port, "unix_socket_dir": "",
        "auth_type": "scram-sha-256" if auth_user is not None else "plain",
        "auth_file": str(workdir / "userlist.txt"),
        "pool_mode": "transaction", "default_pool_size": 10, "server_login_retry": 1,
        "logfile": str(workdir / "pgbouncer.log"), "pidfile": str(workdir / "pgbouncer.pid"),
        "log_connections": 0, "log_disconnections": 0,
    }
    if auth_user is not None:
        config.update(auth_user=auth_user, auth_query=AUTH_QUERY)
    config.update(settings or {})
    lines = ["[databases]", *(f"{db} = host={server_host} port={server_port} dbname={db}" for db in databases),
             "[pgbouncer]", *(f"{k} = {v}" for k, v in config.items())]
    userlist = "".join(f'"{u}" "{p}"\n' for u, p in users.items())
    return "\n".join(lines) + "\n", userlist


def _running_pid(workdir: Path) -> int | None:
    """The pid in PgBouncer's pid file when that process is a live pgbouncer."""
    try:
        pid = int((workdir / "pgbouncer.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"pgbouncer" in cmdline else None


def _write_private(path: Path, text: str, owner: pwd.struct_passwd | None) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    if owner is not None:
        os.chown(tmp, owner.pw_uid, owner.pw_gid)
    os.replace(tmp, path)


def embedded_pgbouncer_running(workdir: Path) -> int | None:
    """The embedded PgBouncer's pid when it runs, else None."""
    return _running_pid(Path(workdir).resolve())


def embedded_pgbouncer_port(workdir: Path) -> int | None:
    """The port of the embedded PgBouncer when it runs, else None."""
    workdir = Path(workdir).resolve()
    try:
        return int((workdir / "port").read_text()) if _running_pid(workdir) is not None else None
    except (OSError, ValueError):
        return None


def embedded_pgbouncer(workdir: Path, server: EmbeddedServer, *, database: str = TENANT_DATABASE,
                       settings: Mapping[str, str | int | float] | None = None) -> int:
    """Start, or reuse, the PgBouncer in front of ``server``'s ``database``; returns its port. Idempotent and
    safe across processes. Raises RuntimeError, whatever went wrong (not installed, the lookup not installable,
    no start): the settings that call it fall back to direct connections instead of failing every process."""
    try:
        return _embedded_pgbouncer(workdir, server, database=database, settings=settings)
    except (OSError, psycopg.Error, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"the embedded PgBouncer could not be started ({type(exc).__name__}: {exc})") from exc


def _embedded_pgbouncer(workdir: Path, server: EmbeddedServer, *, database: str,
                        settings: Mapping[str, str | int | float] | None) -> int:
    binary = pgbouncer_binary()
    workdir = Path(workdir).resolve()
    with _exclusive(workdir.with_name(workdir.name + ".lock")):
        workdir.mkdir(mode=0o700, exist_ok=True)
        port_file = workdir / "port"
        port = int(port_file.read_text()) if port_file.exists() else free_port()
        if _running_pid(workdir) is not None and port_answers(port, timeout=0.5):
            return port
        owner = pwd.getpwnam(SYSTEM_USER) if os.geteuid() == 0 else None
        password = read_or_create_secret(workdir.parent / "secrets" / _AUTH_PASSWORD_FILE,
                                         lambda: os.urandom(24).hex())
        install_auth_query(server.url(database), auth_user=EMBEDDED_AUTH_USER, auth_password=password)
        ini, userlist = pgbouncer_config(workdir=workdir, port=port, server_host="127.0.0.1",
                                         server_port=server.port, databases=[database],
                                         users={EMBEDDED_AUTH_USER: password}, auth_user=EMBEDDED_AUTH_USER,
                                         settings={"default_pool_size": 5, "max_db_connections": 40,
                                                   **(settings or {})})
        _write_private(workdir / "userlist.txt", userlist, owner)
        _write_private(workdir / "pgbouncer.ini", ini, owner)
        port_file.write_text(str(port))
        (workdir / "pgbouncer.pid").unlink(missing_ok=True)  # a stale one (killed, machine rebooted)
        if owner is not None:
            os.chown(workdir, owner.pw_uid, owner.pw_gid)
            _commands, utils = _pg_commands()
            utils.ensure_prefix_permissions(workdir)  # its user must reach the directory, as for the data dir
        as_user = ["-u", SYSTEM_USER] if owner is not None else []
        # -d: it daemonizes, like pg_ctl's server, and outlives this process for the next one to reuse.
        done = subprocess.run([binary, "-d", *as_user, str(workdir / "pgbouncer.ini")], capture_output=True,
                              text=True, timeout=30, check=False)
        deadline = time.monotonic() + 10
        while not port_answers(port, timeout=0.5):
            if time.monotonic() > deadline:
                log = (workdir / "pgbouncer.log")
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start (exit {done.returncode}): "
                                   f"{(done.stderr or '').strip()[-500:]} {tail}")
            time.sleep(0.05)
        return port


def embedded_pgbouncer_stop(workdir: Path, *, timeout_s: float = 10.0) -> int | None:
    """Stop the embedded PgBouncer (SIGINT: a safe shutdown, which waits for transactions under way, then
    SIGTERM); returns the pid it stopped, None when none ran."""
    workdir = Path(workdir).resolve()
    pid = _running_pid(workdir)
    if pid is None:
        return None
    for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return pid
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _running_pid(workdir) != pid:
                return pid
            time.sleep(0.05)
    return pid
