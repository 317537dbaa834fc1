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
- Connections: kept alive per tenant (``_Pool``) when the instance answers HTTP/1.1, so a message's call does not
  connect, nor the instance start a thread for it (issue 39). A kept connection reaches the process that was
  verified when it was opened (an established connection cannot change peer); one the instance closed (idle,
  restarted, killed) is seen before use and dropped, and a call that fails on a reused connection before any
  answer is sent once more on a new one: every POST here is an inbox delivery, which the instance de-duplicates
  by the item's id, and every other call is a read.

No message built here contains the token, the key or a signature.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from controlplane.errors import ApplicationError
from controlplane.fds import readable_now
from provisioning.choices import ResourceKind
from provisioning.models import ProvisionedResource
from provisioning.resources.spec import tenant_spec
from provisioning.selectors import InstanceLocation, PortNotPublished, instance_location
from tenants.models import Tenant

from .signing import sign, signing_key

__all__ = ["InstanceUnavailable", "InstanceProblem", "StreamInterrupted", "InstanceClient", "instance_client",
           "forget_tenant", "CONNECT_TIMEOUT_S", "TARGET_CACHE_S", "KEEPALIVE_IDLE_S"]

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 15.0
# The instance sends a keep-alive every 10 s on its event streams: 30 s of silence is a dead peer.
STREAM_READ_TIMEOUT_S = 30.0
TARGET_CACHE_S = 60.0
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# A kept-alive connection is used again within this long of its last answer (the instance closes one after 30 s
# idle: AGENT_HTTP_KEEPALIVE_S); at most KEEPALIVE_PER_TENANT idle ones per tenant, KEEPALIVE_MAX in the process.
KEEPALIVE_IDLE_S = 20.0
KEEPALIVE_PER_TENANT = 4
KEEPALIVE_MAX = 512


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
    _pool.drop(str(tenant_id))


@dataclass
class _Kept:
    conn: http.client.HTTPConnection
    where: str  # the location it was opened for: a call for another one does not take it
    prefix: str
    idle_since: float


class _Pool:
    """Idle kept-alive connections per tenant, newest last; a connection is out of the pool while in use."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_Kept]] = {}
        self._lock = threading.Lock()

    def take(self, tenant_id: str, where: str) -> _Kept | None:
        """A live idle connection for ``where``, or None. Each one looked at and not taken is closed: stale (too
        old, or readable, which on an idle HTTP connection means the instance closed it) or for another place."""
        now = time.monotonic()
        while True:
            with self._lock:
                kept = self._idle.get(tenant_id)
                if not kept:
                    return None
                candidate = kept.pop()
            if (candidate.where == where and now - candidate.idle_since < KEEPALIVE_IDLE_S
                    and _quiet(candidate.conn)):
                return candidate
            candidate.conn.close()

    def give_back(self, tenant_id: str, kept: _Kept) -> None:
        kept.idle_since = time.monotonic()
        with self._lock:
            mine = self._idle.setdefault(tenant_id, [])
            if len(mine) < KEEPALIVE_PER_TENANT and sum(len(v) for v in self._idle.values()) < KEEPALIVE_MAX:
                mine.append(kept)
                return
        kept.conn.close()

    def drop(self, tenant_id: str) -> None:
        with self._lock:
            kept = self._idle.pop(tenant_id, [])
        for k in kept:
            k.conn.close()

    def forget_all(self) -> None:
        """In a forked child: the parent's connections are the parent's (closing the child's copies of their
        descriptors leaves them open there); a new lock, in case the fork came while another thread held it."""
        idle, self._idle, self._lock = self._idle, {}, threading.Lock()
        for kept in idle.values():
            for k in kept:
                k.conn.close()


def _quiet(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is still open with nothing to read (an answer was read whole, so anything
    readable now is the instance's close, or a stray byte that would corrupt the next answer)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        return not readable_now(sock)
    except (OSError, ValueError):
        return False


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.forget_all)


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


def _where(target: _Target) -> str:
    """Which place a kept connection was opened for: this process's local instances are found anew on each
    connect (their port changes with every restart, and a kept connection outlives none); another driver's
    instance is at its endpoint."""
    return "local" if target.location.local else f"endpoint:{target.location.endpoint}"


class _Retry(Exception):  # noqa: N818 - a signal inside ``InstanceClient._open``
    """Send again: the key was derived anew after a 401."""


class _Closed(Exception):  # noqa: N818 - a signal inside ``InstanceClient._open``
    """A kept connection was closed by the instance before it answered: send on a new one."""


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
    """One tenant's instance, over a kept-alive connection when one is idle (``_Pool``)."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def _open(self, method: str, path_and_query: str, body: bytes, *, accept: str,
              read_timeout: float) -> tuple[_Kept, http.client.HTTPResponse]:
        for attempt in (1, 2):
            target = _target(self.tenant)
            where = _where(target)
            kept = _pool.take(target.tenant_id, where)
            if kept is not None:
                try:
                    return self._on(kept, target, method, path_and_query, body, accept, read_timeout, attempt,
                                    reused=True)
                except _Retry:
                    continue
                except _Closed:
                    pass  # the instance closed it as the request went out: sent once more on a new connection
            sock, host, port, prefix = _connect(target)  # a local one wherever its host listens (its namespace)
            conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
            conn.sock = sock
            try:
                return self._on(_Kept(conn, where, prefix, 0.0), target, method, path_and_query, body, accept,
                                read_timeout, attempt, reused=False)
            except _Retry:
                continue
        raise AssertionError("unreachable")

    @staticmethod
    def _on(kept: _Kept, target: _Target, method: str, path_and_query: str, body: bytes, accept: str,
            read_timeout: float, attempt: int, *, reused: bool) -> tuple[_Kept, http.client.HTTPResponse]:
        """Send the signed request on ``kept`` and read the answer's head; ``_Retry`` after a 401 on the first
        attempt (perhaps a rotated token: the key is derived again, once). On a ``reused`` connection that the
        instance closed or reset before answering (an idle close racing the request, a restart), ``_Closed``;
        any other failure (a timeout above all) is the instance's, as on a new connection."""
        full_path = kept.prefix + path_and_query
        headers = {"Authorization": sign(target.key, target.tenant_id, method, full_path, body),
                   "Accept": accept, "Content-Length": str(len(body))}
        if body:
            headers["Content-Type"] = "application/json"
        try:
            kept.conn.sock.settimeout(read_timeout)
            kept.conn.request(method, full_path, body=body or None, headers=headers)
            resp = kept.conn.getresponse()
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as exc:
            kept.conn.close()
            if reused:
                raise _Closed from exc
            raise InstanceUnavailable() from None
        except (OSError, http.client.HTTPException):
            kept.conn.close()
            raise InstanceUnavailable() from None
        if resp.status == 401 and attempt == 1:
            resp.read()
            kept.conn.close()
            forget_tenant(target.tenant_id)
            raise _Retry
        return kept, resp

    def request_json(self, method: str, path: str, body: dict[str, Any] | None = None,
                     query: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of a 2xx answer; InstanceUnavailable / InstanceProblem otherwise."""
        raw_body = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        kept, resp = self._open(method, path_with_query(path, query), raw_body, accept="application/json",
                                read_timeout=READ_TIMEOUT_S)
        try:
            raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException):
            kept.conn.close()
            raise InstanceUnavailable() from None
        if resp.will_close or not resp.isclosed() or len(raw) > MAX_RESPONSE_BYTES:
            kept.conn.close()
        else:  # read to its end on a connection the instance keeps open: the next call may take it
            _pool.give_back(str(self.tenant.id), kept)
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
        kept, resp = self._open("GET", path_with_query(path, query), b"", accept="text/event-stream",
                                read_timeout=STREAM_READ_TIMEOUT_S)
        conn = kept.conn  # a stream's connection ends with it (the instance closes it): never given back
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
