"""The instance's one way to ask the control plane's internal API: ``GET`` (or ``POST``)
``{base}/internal/v1/...`` with the instance token, a JSON answer back.

Credentials, the task's agent configuration and renewed S3 credentials are each asked this way (and the agent's
own schedules made this way, ``host.schedules``); each caller
turns ``InternalApiUnavailable`` into its own "not now" error (the task waits or blocks, never guesses). The
reason says what went wrong (``control plane said 404``, or the exception's type) and never carries the token,
the URL's query or an answer's body.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["InternalApiUnavailable", "KeptAlivePoster", "internal_get_json", "internal_head_ok",
           "internal_post_json"]


class InternalApiUnavailable(Exception):
    """No usable answer: ``status`` is the HTTP status when the control plane answered with an error."""

    def __init__(self, why: str, status: int | None = None, *, unreached: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.status = status
        # The request certainly never reached the control plane (connection refused, unresolvable name): what a
        # caller recording an effect needs to know (it did not happen), as opposed to a timeout (it may have).
        self.unreached = unreached


def internal_get_json(base_url: str, token: str, path: str, *, timeout_s: float) -> Any:
    """The decoded JSON answer to ``GET {base_url}{path}``; InternalApiUnavailable on an error status, a network
    failure, a timeout or a body that is not JSON."""
    req = urllib.request.Request(  # noqa: S310 - URL comes from the operator's configuration
        f"{base_url.rstrip('/')}{path}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise InternalApiUnavailable(f"control plane said {exc.code}", exc.code) from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        raise InternalApiUnavailable(type(exc).__name__) from None


def internal_head_ok(base_url: str, token: str, path: str, *, timeout_s: float) -> bool:
    """Whether ``HEAD {base_url}{path}`` answers 2xx: a "would a GET give it now?" check that reads no value. Any
    failure is False ("not yet"), so a caller polling it (per heartbeat) simply asks again later."""
    req = urllib.request.Request(  # noqa: S310 - URL comes from the operator's configuration
        f"{base_url.rstrip('/')}{path}", method="HEAD", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, TimeoutError, ValueError):
        return False


def internal_post_json(base_url: str, token: str, path: str, body: Any, *, timeout_s: float,
                       headers: dict[str, str] | None = None) -> Any:
    """The decoded JSON answer to ``POST {base_url}{path}`` with ``body`` as JSON; InternalApiUnavailable as for
    ``internal_get_json``, with ``unreached`` set when the request certainly never arrived."""
    req = urllib.request.Request(  # noqa: S310 - URL comes from the operator's configuration
        f"{base_url.rstrip('/')}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                 "Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise InternalApiUnavailable(f"control plane said {exc.code}", exc.code) from None
    except urllib.error.URLError as exc:
        reason = getattr(exc, "reason", exc)
        raise InternalApiUnavailable(type(reason).__name__,
                                     unreached=isinstance(reason, ConnectionRefusedError | socket.gaierror)) from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise InternalApiUnavailable(type(exc).__name__, unreached=True) from None
    except (TimeoutError, ValueError, OSError) as exc:
        raise InternalApiUnavailable(type(exc).__name__) from None


class KeptAlivePoster:
    """POSTs to one path of the internal API on a connection kept open between calls: the heartbeat's way.

    An idle instance's largest CPU cost was its heartbeat: ``urllib`` builds an opener, resolves, connects and
    tears down for every beat (docs/benchmarks.md, "Idle instances"). ``http.client`` on a kept-alive connection
    sends the request and reads the answer, nothing else. A connection the server closed since the last call
    (keep-alive timeouts, servers that close after each answer) is opened afresh once; the request is only
    resent when it went out on a reused connection that turned out closed, so a beat is never sent twice to a
    server that took it. Not for effects: nothing here says whether a failed request arrived.
    """

    def __init__(self, base_url: str, token: str, path: str, *, timeout_s: float) -> None:
        url = urllib.parse.urlsplit(f"{base_url.rstrip('/')}{path}")
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port
        self._path = url.path + (f"?{url.query}" if url.query else "")
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                         "Host": url.netloc}
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # the heartbeat thread and a stop's last beat may both post

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self._timeout_s)
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def post(self, body: Any) -> int:
        """The answer's status; OSError (and http.client's errors) when there is none."""
        data = json.dumps(body).encode()
        with self._lock:
            for attempt in (1, 2):
                reused = self._conn is not None and self._conn.sock is not None
                conn = self._connection()
                try:
                    conn.request("POST", self._path, body=data, headers=self._headers)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.will_close:
                        conn.close()
                        self._conn = None
                    return resp.status
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    conn.close()
                    self._conn = None
                    if not (reused and attempt == 1):
                        raise
                except BaseException:
                    conn.close()
                    self._conn = None
                    raise
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
