"""The fork server's life (``LOCAL_INSTANCE_LAUNCH=fork``): one per runtime code, the old one gone by itself.

Its isolation is tested with real instances in ``test_isolation_attacks.py``, ``test_isolation_network.py`` and
``test_local_exit_watch.py`` (each parametrized exec/fork).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from provisioning.drivers.local_fork import SERVER_MODULE, ensure_fork_server, fork_server_socket, runtime_fingerprint


def test_new_runtime_code_gets_a_new_server_and_the_old_one_leaves_once_nothing_of_its_own_runs(settings):  # type: ignore[no-untyped-def]
    settings.VAR_DIR = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp")) / "var"  # a unix socket's path is short
    source = Path(settings.BASE_DIR) / "agent_runtime" / "__init__.py"
    before = source.stat()
    first = runtime_fingerprint()
    try:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1))  # an upgrade, as the driver sees one
        assert runtime_fingerprint() != first
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert runtime_fingerprint() == first

    # A server for the old code (retire check every 0.2 s), then the driver's for the code as it is now.
    old_socket = fork_server_socket().with_name("forkserver-0000000000000000.sock")
    old = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, str(old_socket), "0.2"], cwd=settings.BASE_DIR,
                           stdout=subprocess.PIPE)
    try:
        assert old.stdout is not None and b"forkserver_ready" in old.stdout.readline()
        current = ensure_fork_server()
        assert current == fork_server_socket() != old_socket and current.stat().st_mode & 0o777 == 0o700
        assert not old_socket.exists()  # retired by the driver: it takes no new instance
        assert old.wait(timeout=10) == 0  # and, having none left, it leaves
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
        for proc in psutil.process_iter(["cmdline"]):
            if (proc.info["cmdline"] or [])[3:4] == [str(fork_server_socket())]:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(Path(settings.VAR_DIR).parent, ignore_errors=True)
