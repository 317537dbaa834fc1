"""HTTP to a local server, for benchmarks that drive the control plane or an instance over the wire."""

from __future__ import annotations

import http.client

__all__ = ["request", "first_chunk"]


def request(port: int, method: str, path: str, body: bytes, headers: dict[str, str], *,
            timeout: float = 60) -> tuple[int, bytes]:
    """(status, body) of one request to 127.0.0.1:``port`` on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers)
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        c.close()


def first_chunk(port: int, path: str, headers: dict[str, str], *, timeout: float = 60) -> None:
    """Read a reply stream (server-sent events) up to its first ``delta`` (or ``reply``) event."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers)
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {resp.read()[:300]!r}")
        while True:
            line = resp.fp.readline()
            if not line:
                raise RuntimeError(f"stream ended before a chunk: {path}")
            if line.startswith((b"event: delta", b"event: reply")):
                return
    finally:
        c.close()
