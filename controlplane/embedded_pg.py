"""Embedded PostgreSQL for the zero-configuration default.

When ``DATABASE_URL`` is unset the control plane starts (or reuses) a PostgreSQL
server from the ``pgserver`` wheel under ``var/pgdata``. It is a real PostgreSQL,
so schemas, roles and permission checks behave as in production, and so does
authentication: every role, the superuser included, logs in with its password
(``scram-sha-256`` on every ``pg_hba.conf`` line, no ``trust``). The superuser's
password is generated once into ``var/secrets/postgres-superuser-password``.

The server listens on its unix socket (in the data directory, for the control
plane) and on ``127.0.0.1:<port>`` (for the agent instances, whose sandbox hides
``var/``). The port is picked once and kept in ``controlplane.conf`` in the data
directory. Two databases are created: ``controlplane`` (Django's) and ``tenants``
(the tenant schemas); PUBLIC may connect to none of them.

pgserver ships the binaries; the server is driven here with its ``initdb`` and
``pg_ctl`` (pgserver's own start passes ``-h ""``, which would turn TCP off, and
its ``psql()`` assumes trust). As root, PostgreSQL runs as pgserver's system user
``pgserver``, as pgserver itself does. This module does not create roles or schemas.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from controlplane.ports import free_port

from .scram import scram_sha256_verifier

__all__ = ["EmbeddedServer", "embedded_server", "embedded_server_running", "embedded_server_stop",
           "embedded_database_url", "bundled_pg_bin",
           "SUPERUSER", "CONTROL_PLANE_DATABASE", "TENANT_DATABASE", "HBA_RULES"]

SUPERUSER = "postgres"
CONTROL_PLANE_DATABASE = "controlplane"
TENANT_DATABASE = "tenants"
SYSTEM_USER = "pgserver"  # pgserver's choice when run as root (postgres refuses to run as root)
CONF_FILE = "controlplane.conf"
INCLUDE_LINE = f"include_if_exists = '{CONF_FILE}'"
# Every connection, socket or loopback TCP, needs the role's password; nothing else is accepted.
HBA_RULES = (
    "# Written by controlplane.embedded_pg: every role logs in with its password (SCRAM), no trust.\n"
    "local   all  all                scram-sha-256\n"
    "host    all  all  127.0.0.1/32  scram-sha-256\n"
    "host    all  all  ::1/128       scram-sha-256\n"
)
# Shared with provisioning.drivers.postgres_schema: GRANT/REVOKE on a database rewrite its one pg_database
# row, and two at once fail with "tuple concurrently updated".
DATABASE_ACL_LOCK = "tenant-database-acl"


@dataclass(frozen=True)
class EmbeddedServer:
    data_dir: Path
    port: int
    password: str

    @property
    def socket_dir(self) -> Path:
        return self.data_dir

    def url(self, database: str = CONTROL_PLANE_DATABASE) -> str:
        """A libpq URL over loopback TCP, with the superuser's password."""
        return f"postgresql://{SUPERUSER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory lock on ``lock_path`` held across processes (released by the kernel if we die)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def bundled_pg_bin(name: str) -> Path:
    """Path of a PostgreSQL client binary shipped inside the pgserver wheel (e.g. pg_dump)."""
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin" / name


def _pg_commands():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver import _commands, utils
    return _commands, utils


def _system_user() -> str | None:
    return SYSTEM_USER if os.geteuid() == 0 else None


def _prepare_for_system_user(data_dir: Path) -> None:
    """As root, let pgserver's system user own the data directory and run the binaries (as pgserver does)."""
    if _system_user() is None:
        return
    import pwd
    import stat

    commands, utils = _pg_commands()
    utils.ensure_user_exists(SYSTEM_USER)
    utils.ensure_prefix_permissions(data_dir)
    utils.ensure_prefix_permissions(commands.POSTGRES_BIN_PATH)
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_folder_permissions(commands.POSTGRES_BIN_PATH, execute | read)
    utils.ensure_folder_permissions(commands.POSTGRES_BIN_PATH.parent / "lib", read)
    entry = pwd.getpwnam(SYSTEM_USER)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)


def _write_owned(path: Path, text: str, owner_of: Path) -> None:
    """Replace ``path`` atomically, owned like ``owner_of`` (the data directory) and private to it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    st = owner_of.stat()
    os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _ensure_conf(data_dir: Path) -> int:
    """Our settings in ``controlplane.conf`` (included from postgresql.conf); returns the TCP port, kept once picked."""
    conf = data_dir / CONF_FILE
    existing = conf.read_text() if conf.exists() else ""
    found = re.search(r"^port\s*=\s*(\d+)", existing, re.MULTILINE)
    port = int(found.group(1)) if found else free_port()
    wanted = (
        "# Written by controlplane.embedded_pg; the port was picked once and is reused on every start.\n"
        "listen_addresses = '127.0.0.1'\n"
        f"port = {port}\n"
        f"unix_socket_directories = '{data_dir}'\n"
        "password_encryption = 'scram-sha-256'\n"
    )
    if existing != wanted:
        _write_owned(conf, wanted, data_dir)
    main = data_dir / "postgresql.conf"
    text = main.read_text()
    if INCLUDE_LINE not in text.splitlines():
        _write_owned(main, text.rstrip("\n") + "\n" + INCLUDE_LINE + "\n", data_dir)
    return port


@dataclass(frozen=True)
class _Running:
    pid: int
    port: int
    socket_dir: str
    listen: str


def _running(data_dir: Path) -> _Running | None:
    """The server postmaster.pid names, if that process is alive and a postgres."""
    import psutil

    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
        listen = lines[5].strip() if len(lines) > 5 else ""
        if "postgres" not in psutil.Process(pid).name():
            return None
    except (FileNotFoundError, IndexError, ValueError, psutil.Error):
        return None
    return _Running(pid=pid, port=port, socket_dir=socket_dir, listen=listen)


def _pg_ctl(data_dir: Path, *args: str) -> None:
    commands, _ = _pg_commands()
    try:
        commands.pg_ctl(list(args), pgdata=data_dir, user=_system_user(), timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        log = data_dir / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"pg_ctl {' '.join(args)} failed for {data_dir}: {exc}\n{tail}") from exc


def _start(data_dir: Path, *, tcp: bool = True) -> None:
    # Without tcp the server listens on its socket only (command-line settings beat the config files): the
    # state an old trust-initialised data directory is in until its superuser has a password.
    extra = [] if tcp else ["-o", "-c listen_addresses="]
    _pg_ctl(data_dir, "-w", "-l", str(data_dir / "log"), *extra, "start")


def _hba_trusts_tcp(hba: str) -> bool:
    rules = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return any(r[0].startswith("host") and "trust" in r for r in rules)


def _socket_connect(socket_dir: Path | str, port: int, password: str, dbname: str = "postgres"):
    import psycopg

    return psycopg.connect(host=str(socket_dir), port=port, user=SUPERUSER, password=password, dbname=dbname,
                           autocommit=True, connect_timeout=30, application_name="controlplane-embedded-pg")


def _ensure_scram(data_dir: Path, password: str) -> None:
    """Give the superuser its password over the still-trusted socket, then require passwords everywhere.

    In that order, so that a crash in between never leaves a server nobody can log in to; the hba file is
    only ever written after the password is set, so "our hba is in place" implies "the password is set".
    """
    from psycopg import sql

    hba_path = data_dir / "pg_hba.conf"
    if hba_path.read_text() == HBA_RULES:
        return
    running = _running(data_dir)
    if running is not None and running.listen and _hba_trusts_tcp(hba_path.read_text()):
        _pg_ctl(data_dir, "-w", "-m", "fast", "stop")  # trust over TCP: not one more connection like that
        running = None
    if running is None:
        _start(data_dir, tcp=False)
        running = _running(data_dir)
        assert running is not None, "the embedded PostgreSQL did not start"
    # pgserver put the socket elsewhere when the data directory's path is too long for one.
    with _socket_connect(running.socket_dir or data_dir, running.port, password) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(SUPERUSER), sql.Literal(scram_sha256_verifier(password))))
        _write_owned(hba_path, HBA_RULES, data_dir)
        conn.execute("SELECT pg_reload_conf()")


def _ensure_databases(conn, names: tuple[str, ...]) -> None:
    """Create ``names`` if missing; PUBLIC may connect to (or make temporary tables in) no database here."""
    from psycopg import sql

    existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
    for name in names:
        if name not in existing:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    open_dbs = [row[0] for row in conn.execute(
        "SELECT datname FROM pg_database WHERE datallowconn AND (has_database_privilege('public', oid, 'CONNECT')"
        " OR has_database_privilege('public', oid, 'TEMP'))")]
    if open_dbs:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (DATABASE_ACL_LOCK,))
            for name in open_dbs:
                conn.execute(sql.SQL("REVOKE CONNECT, TEMP ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))


def embedded_server(data_dir: Path, databases: tuple[str, ...] = (CONTROL_PLANE_DATABASE, TENANT_DATABASE)
                    ) -> EmbeddedServer:
    """Initialise, upgrade, start or reuse the embedded server; idempotent, safe across processes.

    The server outlives this process on purpose: the web process, the Celery worker and the
    agent instances all share it, and the next ``make demo`` reuses it.
    """
    from .secretfiles import DEV_PG_SUPERUSER_PASSWORD_FILE, dev_secret

    data_dir = Path(data_dir).resolve()
    # pgserver's module-level lock lives under XDG_RUNTIME_DIR; keep it next to var/ rather than in /run/user.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    password = dev_secret(data_dir.parent, DEV_PG_SUPERUSER_PASSWORD_FILE)
    # The web server, the worker, beat and a management command may all start at once on a fresh var/:
    # initialisation, the upgrade to SCRAM, start and database creation are check-then-act, so they happen
    # under one lock next to the data directory.
    with _exclusive(data_dir.with_name(data_dir.name + ".lock")):
        data_dir.mkdir(mode=0o700, exist_ok=True)
        _prepare_for_system_user(data_dir)
        if not (data_dir / "PG_VERSION").exists():
            commands, _ = _pg_commands()
            # Local trust only until _ensure_scram sets the password a moment later, on a socket inside this
            # 0700 directory; TCP asks for a password from the first start.
            commands.initdb(["--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=utf8",
                             "-U", SUPERUSER], pgdata=data_dir, user=_system_user())
        port = _ensure_conf(data_dir)
        _ensure_scram(data_dir, password)
        running = _running(data_dir)
        if running is not None and (running.port != port or running.listen != "127.0.0.1"):
            _pg_ctl(data_dir, "-w", "-m", "fast", "stop")  # started without TCP (by pgserver, or the upgrade)
            running = None
        if running is None:
            _start(data_dir)
        with _socket_connect(data_dir, port, password) as conn:
            _ensure_databases(conn, databases)
    return EmbeddedServer(data_dir=data_dir, port=port, password=password)


def embedded_server_running(data_dir: Path) -> int | None:
    """The postmaster's pid when the embedded server under ``data_dir`` runs, else None."""
    running = _running(Path(data_dir).resolve())
    return running.pid if running is not None else None


def embedded_server_stop(data_dir: Path) -> int | None:
    """Stop the embedded server (``pg_ctl stop -m fast``: sessions are ended, nothing is lost); returns the
    pid it stopped, None when none ran. Under the start lock, so no process starts it again halfway."""
    data_dir = Path(data_dir).resolve()
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent / "run"))  # as embedded_server does
    with _exclusive(data_dir.with_name(data_dir.name + ".lock")):
        running = _running(data_dir)
        if running is None:
            return None
        _pg_ctl(data_dir, "-w", "-m", "fast", "stop")
    return running.pid


def embedded_database_url(data_dir: Path, database: str = CONTROL_PLANE_DATABASE) -> str:
    """Start or reuse the embedded server and return a URL (loopback TCP, with the password) for ``database``."""
    if not database.isidentifier():
        raise ValueError("embedded database name must be a plain identifier")
    databases = tuple(dict.fromkeys((CONTROL_PLANE_DATABASE, TENANT_DATABASE, database)))
    return embedded_server(data_dir, databases).url(database)
