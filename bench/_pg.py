"""Private PostgreSQL 15 servers for benchmarks that need more (or more than one) server than the machine's.

Debian's binaries (/usr/lib/postgresql/15/bin), a throwaway data directory, trust on 127.0.0.1 only (nothing
else can reach it), stopped and removed by ``stop``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PG_BIN", "free_port", "as_postgres", "start", "stop"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_postgres() -> dict[str, str]:
    return {"user": "postgres"} if os.geteuid() == 0 else {}  # PostgreSQL refuses to run as root


def start(name: str, *, options: str = "") -> tuple[Path, str]:
    """(data directory's parent, superuser URL of its ``postgres`` database); ``options`` go to ``postgres -c``."""
    base = Path(tempfile.mkdtemp(prefix=f"cp-bench-{name}-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    subprocess.run([PG_BIN / "initdb", "-D", base / "data", "-U", "postgres", "--auth=trust"], check=True,
                   capture_output=True, **as_postgres())
    port = free_port()
    subprocess.run([PG_BIN / "pg_ctl", "-D", base / "data", "-w", "-l", base / "log", "-o",
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {base} {options}", "start"], check=True,
                   capture_output=True, **as_postgres())
    return base, f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop(base: Path) -> None:
    subprocess.run([PG_BIN / "pg_ctl", "-D", base / "data", "-w", "-m", "fast", "stop"], capture_output=True,
                   **as_postgres())
    shutil.rmtree(base, ignore_errors=True)
