"""The heartbeat's kept-alive connection and the host's HTTP server that no timer wakes (issue 39: an idle
instance's CPU). Against real HTTP servers on real sockets: one that keeps connections open (HTTP/1.1) and counts
them, one that closes after every answer, and one that dies between beats."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_runtime.host.process import HostHTTPServer
from agent_runtime.internal_api import KeptAlivePoster


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted receiver binds the port its predecessor had

    def __init__(self, keep_alive: bool, port: int = 0) -> None:
        self.connections = 0
        self.accepted: list[socket.socket] = []
        self.bodies: list[dict] = []
        self.auth: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                receiver.connections += 1
                receiver.accepted.append(self.request)
                super().setup()

            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                n = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(n)))
                receiver.auth.add(self.headers["Authorization"])
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def kill(self) -> None:
        """Gone as a killed process is: the listening socket and every open connection closed."""
        self.shutdown()
        self.server_close()
        for sock in self.accepted:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def receivers() -> Iterator[list[_Receiver]]:
    made: list[_Receiver] = []
    yield made
    for r in made:
        r.shutdown()
        r.server_close()


def test_beats_share_one_connection_where_the_server_keeps_it(receivers: list[_Receiver]) -> None:
    server = _Receiver(keep_alive=True)
    receivers.append(server)
    poster = KeptAlivePoster(server.url, "tok", "/internal/v1/heartbeat", timeout_s=2.0)
    for i in range(5):
        assert poster.post({"n": i}) == 204
    assert [b["n"] for b in server.bodies] == [0, 1, 2, 3, 4]
    assert server.connections == 1
    assert server.auth == {"Bearer tok"}


def test_a_server_that_closes_after_each_answer_gets_each_beat_once(receivers: list[_Receiver]) -> None:
    server = _Receiver(keep_alive=False)
    receivers.append(server)
    poster = KeptAlivePoster(server.url, "tok", "/internal/v1/heartbeat", timeout_s=2.0)
    for i in range(3):
        assert poster.post({"n": i}) == 204
    assert [b["n"] for b in server.bodies] == [0, 1, 2]  # none twice, none lost
    assert server.connections == 3


def test_a_restarted_server_gets_the_next_beat_on_a_new_connection(receivers: list[_Receiver]) -> None:
    first = _Receiver(keep_alive=True)
    port = first.server_address[1]
    poster = KeptAlivePoster(first.url, "tok", "/internal/v1/heartbeat", timeout_s=2.0)
    assert poster.post({"n": 0}) == 204
    first.kill()  # the kept connection's peer is gone
    with pytest.raises(OSError):  # nothing listens: the beat fails (and is logged by the host), no hang
        poster.post({"n": 1})
    restarted = _Receiver(keep_alive=True, port=port)  # the control plane back on its port
    receivers.append(restarted)
    assert poster.post({"n": 2}) == 204
    assert [b["n"] for b in restarted.bodies] == [2]
    assert restarted.connections == 1


def _switches(tid: int | None) -> int:
    """The thread's voluntary context switches: each time it slept and was woken."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_the_hosts_http_server_sleeps_until_asked_and_stops_at_once() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HostHTTPServer(("127.0.0.1", 0), Handler)
    loop = threading.Thread(target=server.serve_until_shutdown, daemon=True)
    loop.start()
    time.sleep(0.3)
    before = _switches(loop.native_id)
    time.sleep(1.5)  # the standard library's loop would have woken three times
    assert _switches(loop.native_id) - before == 0
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
    t0 = time.monotonic()
    server.shutdown()
    took = time.monotonic() - t0
    loop.join(5)
    assert not loop.is_alive()
    assert took < 2.0, f"shutdown took {took:.2f} s"
    server.server_close()
