"""The web tier's gunicorn worker: gthread, with a time limit on every blocking read and write of a client.

Threaded workers let a conversation's reply stream (server-sent events) hold one thread instead of a whole sync
worker, but gthread itself never times out a client that trickles its request (slowloris): the thread would be
pinned for good. Here every client socket is blocking *with a timeout* (gunicorn's ``timeout`` setting), on
the first request and on every keep-alive request after it (gthread switches a socket back to blocking before
each request; that switch keeps the limit). A reply stream writes at least every keep-alive interval (10 s),
well inside it. Loaded only by gunicorn (deploy/gunicorn.conf.py).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker

__all__ = ["TimedThreadWorker"]


class _TimedSocket(socket.socket):
    __slots__ = ("limit_s",)
    limit_s: float

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.settimeout(self.limit_s)  # blocking, but never for longer than the limit
        else:
            super().setblocking(False)


def _timed(sock: socket.socket, limit_s: float) -> _TimedSocket:
    timed = _TimedSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    timed.limit_s = limit_s
    timed.setblocking(True)
    return timed


class TimedThreadWorker(ThreadWorker):
    def accept(self, listener: Any) -> None:
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            conn = TConn(self.cfg, _timed(client_sock, float(self.cfg.timeout)), client_addr,
                         listener.getsockname())
            self.enqueue_req(conn)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
