"""Loopback listeners that forward to granted unix sockets (an instance in a network namespace of its own).

With ``LOCAL_INSTANCE_NETWORK=isolated`` the control plane gives a sandboxed instance only its own loopback and a
directory of unix sockets, each leading to exactly one destination it may reach (``AGENT_NET_FORWARDS``:
``<port>=<socket path>,...``). libpq speaks unix sockets itself; HTTP clients (urllib for the internal API, boto3
for an S3 endpoint) do not, so for each of those the host listens on ``127.0.0.1:<port>`` inside its namespace and
copies bytes both ways to a fresh connection to the socket. Threads that block in ``accept``/``recv`` (nothing
polls, so an idle instance spends no CPU here); two threads per open connection, which for the internal API
lives as long as one request.

It decides nothing: which destinations exist is the control plane's (the sockets it binds into the sandbox); a
listener here only makes a socket usable by clients that need a TCP address.
"""

from __future__ import annotations

import logging
import socket
import threading

__all__ = ["parse_forwards", "start_forwards"]

log = logging.getLogger(__name__)
_CHUNK = 65536


def parse_forwards(spec: str) -> list[tuple[int, str]]:
    """``"8000=/run/agent-net/control-plane.sock,9000=/run/agent-net/s3.sock"`` -> [(8000, path), ...]."""
    out: list[tuple[int, str]] = []
    for item in spec.split(","):
        if not item.strip():
            continue
        port, _, path = item.strip().partition("=")
        if not port.isdigit() or not path.startswith("/"):
            raise ValueError(f"AGENT_NET_FORWARDS: {item!r} is not <port>=<absolute socket path>")
        out.append((int(port), path))
    return out


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        # The other direction may still be sending (a response after the request's end): half-close only.
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError as exc:
        log.warning("granted socket unreachable", extra={"event": "net_forward_failed", "socket": path,
                                                         "error": exc.__class__.__name__})
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True, name="net-forward-back")
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_loop(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(client, path), daemon=True, name="net-forward").start()


def start_forwards(spec: str) -> list[socket.socket]:
    """Listen on ``127.0.0.1:<port>`` for each forward of ``spec`` (before anything connects to them) and serve
    each in a daemon thread; returns the listening sockets."""
    listeners = []
    for port, path in parse_forwards(spec):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        threading.Thread(target=_accept_loop, args=(listener, path), daemon=True, name=f"net-forward-{port}").start()
        listeners.append(listener)
    return listeners
