"""Embedded PostgreSQL for the zero-configuration default.

When ``DATABASE_URL`` is unset the control plane starts (or reuses) a PostgreSQL
server from the ``pgserver`` wheel under ``var/pgdata``. It is a real PostgreSQL,
so schemas, roles and permission checks behave as in production. This module only
starts the server and returns its URL; it does not create roles or schemas.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

__all__ = ["embedded_database_url", "bundled_pg_bin"]


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


def embedded_database_url(data_dir: Path, database: str = "controlplane") -> str:
    """Start or reuse the embedded server and return a URL for ``database`` on it.

    The server outlives this process on purpose (``cleanup_mode=None``): the web
    process, the Celery worker and the agent instances all share it, and the next
    ``make demo`` reuses it.
    """
    if not database.isidentifier():
        raise ValueError("embedded database name must be a plain identifier")
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    # The web server, the worker, beat and a management command may all start at once on a fresh
    # var/: pgserver's own lock lives under XDG_RUNTIME_DIR (which may differ between them) and its
    # mkdir of the data directory and our "create the database if missing" are check-then-act.
    # One lock next to the data directory makes initialisation, start and creation happen once.
    with _exclusive(data_dir.with_name(data_dir.name + ".lock")):
        data_dir.mkdir(mode=0o700, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            server = pgserver.get_server(str(data_dir), cleanup_mode=None)
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")  # noqa: S608 - checked
        if "(1 row)" not in exists:
            server.psql(f'CREATE DATABASE "{database}";')
    socket_dir = str(data_dir)
    return f"postgresql://postgres@/{database}?host={quote(socket_dir, safe='')}"
