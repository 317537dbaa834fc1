"""One HTTP request to a local server, for benchmarks that drive the control plane or an instance over the wire."""

from __future__ import annotations

import http.client

__all__ = ["request"]


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
