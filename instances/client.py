"""The signed instance client: calls to one tenant's instance API (docs/instance-api.md), signed with that
instance's key. Every feature that talks to an instance (conversations, tasks, effects, logs; the screens above
them) goes through here.

- Where: ``provisioning.selectors.instance_location`` (cached with the key): a local instance publishes a new
  port on every restart, so that port is read on every call; any other driver's instance is at its endpoint.
- Key: derived from the instance token in the vault; the derived key (never the token) is cached per
  tenant in this process for ``TARGET_CACHE_S``, so a call costs no vault decrypt. A 401 from the
  instance drops the cache entry and the call is signed again once (the token may have been rotated).
- Failures: unreachable, not ready, 5xx or a timeout -> ``InstanceUnavailable`` (503 with Retry-After);
  an instance problem (4xx) -> ``InstanceProblem`` with the same status, code and detail.

No message built here contains the token, the key or a signature.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from controlplane.errors import ApplicationError
from provisioning.choices import ResourceKind
from provisioning.models import ProvisionedResource
from provisioning.resources.spec import tenant_spec
from provisioning.selectors import InstanceLocation, PortNotPublished, instance_location
from tenants.models import Tenant

from .signing import sign, signing_key

__all__ = ["InstanceUnavailable", "InstanceProblem", "StreamInterrupted", "InstanceClient", "instance_client",
           "forget_tenant", "CONNECT_TIMEOUT_S", "TARGET_CACHE_S"]

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 15.0
# The instance sends a keep-alive every 10 s on its event streams: 30 s of silence is a dead peer.
STREAM_READ_TIMEOUT_S = 30.0
TARGET_CACHE_S = 60.0
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class InstanceUnavailable(ApplicationError):
    """The instance is stopped, restarting, recovering or not ready: try again shortly."""

    status_code = 503
    title = "Instance unavailable"
    type_slug = "instance-unavailable"
    retry_after_s = 1

    def __init__(self, detail: str = "the agent instance is not reachable right now; try again shortly",
                 *, retry_after_s: int = 1) -> None:
        super().__init__(detail, extra={"code": "instance_unavailable"})
        self.retry_after_s = retry_after_s


# Members of an instance's problem passed on as they are: what a refusal names (the thread's running task, the
# effect a rollback would have forgotten). Any other member stays inside.
PASSED_PROBLEM_MEMBERS = ("task", "effect")


class InstanceProblem(ApplicationError):
    """A problem+json answer of the instance, re-raised with its status, code and detail (and the members in
    ``PASSED_PROBLEM_MEMBERS``)."""

    def __init__(self, status: int, code: str, title: str, detail: str,
                 members: dict[str, Any] | None = None) -> None:
        self.members = {k: v for k, v in (members or {}).items() if k in PASSED_PROBLEM_MEMBERS}
        super().__init__(detail, extra={"code": code, **self.members})
        self.status_code = status
        self.code = code
        self.title = title or "Instance refused the request"
        self.type_slug = code.replace("_", "-") if code else "instance-error"

    def as_problem(self) -> dict[str, Any]:
        return {"status": self.status_code, "code": self.code, "title": self.title, "detail": self.detail,
                **self.members}

    @classmethod
    def from_problem(cls, problem: dict[str, Any]) -> InstanceProblem:
        return cls(int(problem.get("status") or 400), str(problem.get("code") or ""),
                   str(problem.get("title") or ""), str(problem.get("detail") or ""), problem)


class StreamInterrupted(Exception):
    """The upstream stream broke off (the instance died or the connection dropped)."""


@dataclass(frozen=True)
class _Target:
    tenant_id: str
    key: bytes
    location: InstanceLocation
    fetched_at: float


_cache: dict[str, _Target] = {}
_cache_lock = threading.Lock()


def forget_tenant(tenant_id: str) -> None:
    with _cache_lock:
        _cache.pop(str(tenant_id), None)


def _load_target(tenant: Tenant) -> _Target:
    resources = list(ProvisionedResource.objects.filter(
        tenant=tenant, kind__in=[ResourceKind.VOLUME, ResourceKind.RUNTIME, ResourceKind.DATABASE,
                                 ResourceKind.OBJECTSTORE]))
    spec = tenant_spec(tenant, with_secrets=("instance_token",), resources=resources)
    key = signing_key(spec.secrets["instance_token"])
    return _Target(str(tenant.id), key, instance_location(tenant=tenant, resources=resources), time.monotonic())


def _target(tenant: Tenant) -> _Target:
    tid = str(tenant.id)
    with _cache_lock:
        hit = _cache.get(tid)
    if hit is not None and time.monotonic() - hit.fetched_at < TARGET_CACHE_S:
        return hit
    fresh = _load_target(tenant)
    with _cache_lock:
        _cache[tid] = fresh
    return fresh


def _address(target: _Target) -> tuple[str, int, str]:
    """(host, port, path prefix) of the instance, or InstanceUnavailable."""
    location = target.location
    if location.local:
        port = location.published_port()
        if port is None:
            raise InstanceUnavailable("the agent instance is not running (no port published)")
        return "127.0.0.1", port, ""
    if not location.endpoint:
        raise InstanceUnavailable("the agent instance has no endpoint yet")
    url = urlsplit(location.endpoint)
    if url.scheme != "http" or not url.hostname:
        raise InstanceUnavailable("the agent instance's endpoint is not usable")
    return url.hostname, url.port or 80, url.path.rstrip("/")


def _connect(target: _Target) -> tuple[socket.socket, str, int | None, str]:
    """(connected socket, host, port, path prefix) of the instance; InstanceUnavailable when it cannot be reached.
    A local instance's port is verified once, by the connect itself (``_address`` checked it a second time)."""
    location = target.location
    try:
        if location.local:
            host, port, prefix = "127.0.0.1", None, ""
            sock = location.connect(timeout=CONNECT_TIMEOUT_S)
        else:
            host, port, prefix = _address(target)
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except PortNotPublished:
        raise InstanceUnavailable("the agent instance is not running (no port published)") from None
    except OSError:
        raise InstanceUnavailable() from None
    # http.client writes the headers and the body in two sends: NODELAY keeps Nagle from holding the body back
    # until the instance acknowledges the headers.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, host, port, prefix


def path_with_query(path: str, query: dict[str, Any] | None = None) -> str:
    items = [(k, str(v)) for k, v in (query or {}).items() if v is not None and v != ""]
    return path + ("?" + urlencode(items) if items else "")


def _problem_of(status: int, raw: bytes) -> ApplicationError:
    if status == 503 or status >= 500:
        return InstanceUnavailable("the agent instance is not ready; try again shortly")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return InstanceProblem(status, str(body.get("code") or ""), str(body.get("title") or ""),
                           str(body.get("detail") or f"the agent instance answered {status}"), body)


class InstanceClient:
    """One tenant's instance. One HTTP connection per call (keep-alive buys little next to the signature)."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def _open(self, method: str, path_and_query: str, body: bytes, *, accept: str,
              read_timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        for attempt in (1, 2):
            target = _target(self.tenant)
            sock, host, port, prefix = _connect(target)  # a local one wherever its host listens (its namespace)
            full_path = prefix + path_and_query
            headers = {"Authorization": sign(target.key, target.tenant_id, method, full_path, body),
                       "Accept": accept, "Content-Length": str(len(body))}
            if body:
                headers["Content-Type"] = "application/json"
            conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
            conn.sock = sock
            try:
                sock.settimeout(read_timeout)
                conn.request(method, full_path, body=body or None, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                conn.close()
                raise InstanceUnavailable() from None
            if resp.status == 401 and attempt == 1:
                # Perhaps a rotated token: derive the key again, once.
                resp.read()
                conn.close()
                forget_tenant(target.tenant_id)
                continue
            return conn, resp
        raise AssertionError("unreachable")

    def request_json(self, method: str, path: str, body: dict[str, Any] | None = None,
                     query: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of a 2xx answer; InstanceUnavailable / InstanceProblem otherwise."""
        raw_body = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        conn, resp = self._open(method, path_with_query(path, query), raw_body, accept="application/json",
                                read_timeout=READ_TIMEOUT_S)
        try:
            raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException):
            raise InstanceUnavailable() from None
        finally:
            conn.close()
        if resp.status == 401:
            raise InstanceUnavailable("the agent instance refused the control plane's signature")
        if resp.status >= 300:
            raise _problem_of(resp.status, raw)
        if len(raw) > MAX_RESPONSE_BYTES:
            raise InstanceUnavailable("the agent instance's answer is too large")
        try:
            data = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            raise InstanceUnavailable("the agent instance answered something that is not JSON") from None
        return resp.status, data if isinstance(data, dict) else {"data": data}

    def stream(self, path: str, query: dict[str, Any] | None = None) -> Iterator[bytes]:
        """The upstream SSE bytes as they arrive. Raises InstanceUnavailable / InstanceProblem before the
        first byte, StreamInterrupted if the stream breaks off afterwards (not at a clean EOF)."""
        conn, resp = self._open("GET", path_with_query(path, query), b"", accept="text/event-stream",
                                read_timeout=STREAM_READ_TIMEOUT_S)
        if resp.status != 200:
            try:
                raw = resp.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            if resp.status == 401:
                raise InstanceUnavailable("the agent instance refused the control plane's signature")
            raise _problem_of(resp.status, raw)
        return _chunks(conn, resp)


def _chunks(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> Iterator[bytes]:
    try:
        while True:
            try:
                chunk = resp.read1(64 * 1024)
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                raise StreamInterrupted(type(exc).__name__) from None
            if not chunk:
                return
            yield chunk
    finally:
        conn.close()


def instance_client(tenant: Tenant) -> InstanceClient:
    return InstanceClient(tenant)
