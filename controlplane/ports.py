"""Local TCP ports: one free to listen on, and whether something answers on one.

For the services the control plane starts beside itself (the embedded PostgreSQL, PgBouncer) and for the tests'
peers. A free port is free when asked, not reserved: the caller binds it soon after, and a service that loses the
race fails to start and is started again on another.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_answers"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_answers(port: int, *, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to 127.0.0.1:``port`` is accepted within ``timeout`` seconds."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False
