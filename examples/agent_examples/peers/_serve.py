"""Shared start-up for the sinks: bind, announce the port (stdout and optional port file), serve."""

from __future__ import annotations

import os
import signal
import socketserver
import sys
import tempfile
from pathlib import Path


def announce(server: socketserver.BaseServer, name: str) -> None:
    announce_port(server.server_address[1], name)  # type: ignore[index]


def announce_port(port: int, name: str) -> None:
    """For peers that are not socketserver servers (the aiosmtpd relay): the same announcement by port."""
    port_file = os.environ.get("AGENT_SINK_PORT_FILE")
    if port_file:
        fd, tmp = tempfile.mkstemp(dir=Path(port_file).parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(str(port))
        os.replace(tmp, port_file)
    print(f"{name} listening on 127.0.0.1:{port}", flush=True)


def serve_until_signal(server: socketserver.BaseServer) -> None:
    def stop(_sig: int, _frame: object) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.1)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
