"""The egress proxy as the control plane runs it, backed by PostgreSQL: one tenant's, or the machine's.

``start_egress_proxy(tenant_id=..., listen=...)`` inside a running event loop serves one tenant and returns the
asyncio server (close it to stop); ``start_egress_proxy(listen=...)`` without a tenant serves every tenant of the
machine, each request naming its tenant by proxy authentication (``FleetTenants``: the user is the tenant id, the
secret its instance token, verified as the internal API verifies it and cached for ``EGRESS_RULES_REFRESH_S``).
The fleet proxy is what ``LOCAL_INSTANCE_NETWORK=isolated`` wires every instance to (one process for the machine:
an idle tenant costs a dictionary entry, not a process). ``run_egress_proxy`` blocks (``manage.py egress_proxy``).

The database is reached from a bounded pool of threads (the ORM is synchronous): one per single-tenant proxy, a
few for the fleet, whatever the traffic. The allow-list is re-read at most every ``EGRESS_RULES_REFRESH_S``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connections

from instances.identity import instance_verify

from .proxy import Decision, EgressPolicy, ProxyLimits, start_proxy
from .rules import AllowList
from .selectors import allow_list_for_tenant
from .services import decision_record

__all__ = ["FleetTenants", "TenantEgressPolicy", "limits_from_settings", "listen_parse", "run_egress_proxy",
           "start_egress_proxy"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
# The fleet proxy's database threads (and so its connections), whatever the number of tenants and requests.
_FLEET_DB_THREADS = 2
# Verified credentials kept at most (an entry is a digest and a tenant id); the oldest go first.
_FLEET_CACHE_MAX = 10_000


def limits_from_settings(**overrides: Any) -> ProxyLimits:
    values: dict[str, Any] = {
        "max_connections": settings.EGRESS_MAX_CONNECTIONS,
        "max_connections_total": settings.EGRESS_MAX_CONNECTIONS_TOTAL,
        "header_timeout_s": settings.EGRESS_HEADER_TIMEOUT_S,
        "connect_timeout_s": settings.EGRESS_CONNECT_TIMEOUT_S,
        "idle_timeout_s": settings.EGRESS_IDLE_TIMEOUT_S,
        "max_duration_s": settings.EGRESS_MAX_DURATION_S,
        "allow_private_addresses": settings.EGRESS_ALLOW_PRIVATE_ADDRESSES,
    }
    values.update(overrides)
    return ProxyLimits(**values)


def listen_parse(text: str) -> str | tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6) or a unix socket path (absolute, or ``unix:path``)."""
    if text.startswith("unix:"):
        return text[5:]
    if text.startswith("/"):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen on host:port or a unix socket path, not {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class TenantEgressPolicy:
    """One tenant's allow-list (cached for ``refresh_s``) and decision log, on one database thread."""

    def __init__(self, tenant_id: object, *, refresh_s: float | None = None,
                 db: ThreadPoolExecutor | None = None) -> None:
        self.tenant_id = uuid.UUID(str(tenant_id))  # ValueError now, not a refused request later
        self.refresh_s = settings.EGRESS_RULES_REFRESH_S if refresh_s is None else refresh_s
        # Its own thread, or the fleet's (shared by every tenant's policy: then the fleet closes it).
        self._db = db or ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"egress-db-{tenant_id}")
        self._owns_db = db is None
        self._allow: AllowList | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    async def _in_db(self, fn: Any, /, **kwargs: Any) -> Any:
        def call() -> Any:
            close_old_connections()
            return fn(**kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._db, call)

    async def permits(self, host: str, port: int) -> bool:
        async with self._lock:
            if self._allow is None or time.monotonic() - self._loaded_at >= self.refresh_s:
                self._allow = await self._in_db(allow_list_for_tenant, tenant_id=self.tenant_id)
                self._loaded_at = time.monotonic()
            return self._allow.permits(host, port)

    async def record(self, decision: Decision) -> None:
        try:
            await self._in_db(decision_record, tenant_id=self.tenant_id, decision=decision)
        except Exception:  # the log must not take the proxy down; the decision itself was already enforced
            logger.exception("egress decision for tenant %s not recorded", self.tenant_id)

    async def close(self) -> None:
        """Close this policy's database connection (in its own thread, where Django keeps it) and the thread."""
        if self._owns_db:
            await _close_executor(self._db, 1)


async def _close_executor(db: ThreadPoolExecutor, threads: int) -> None:
    """Close the database connection of each of the executor's threads (Django keeps one per thread), then it."""
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(loop.run_in_executor(db, connections.close_all) for _ in range(threads)))
    db.shutdown(wait=True)


def _tenant_of(*, user: str, secret: str) -> str | None:
    """The tenant whose live instance holds ``secret`` as its token, when ``user`` names that same tenant."""
    instance = instance_verify(secret)
    if instance is None or str(instance.tenant_id) != user:
        return None
    return str(instance.tenant_id)


class FleetTenants:
    """Every tenant of the machine, for the fleet proxy: a credential (tenant id, instance token) opens that tenant's
    policy. A verified credential is remembered by its digest (never the token) for ``refresh_s``, so a busy instance
    costs one lookup per window, and a rotated token or a deleted tenant stops working within it."""

    def __init__(self, *, refresh_s: float | None = None) -> None:
        self.refresh_s = settings.EGRESS_RULES_REFRESH_S if refresh_s is None else refresh_s
        self._db = ThreadPoolExecutor(max_workers=_FLEET_DB_THREADS, thread_name_prefix="egress-db-fleet")
        self._verified: dict[bytes, tuple[str, float]] = {}
        self._policies: dict[str, TenantEgressPolicy] = {}

    async def policy_for(self, user: str, secret: str) -> EgressPolicy | None:
        key = hashlib.sha256(f"{user}\0{secret}".encode()).digest()
        hit = self._verified.get(key)
        if hit is None or time.monotonic() - hit[1] >= self.refresh_s:
            self._verified.pop(key, None)

            def verify() -> str | None:
                close_old_connections()
                return _tenant_of(user=user, secret=secret)

            tenant_id = await asyncio.get_running_loop().run_in_executor(self._db, verify)
            if tenant_id is None:
                return None
            if len(self._verified) >= _FLEET_CACHE_MAX:
                self._verified.pop(next(iter(self._verified)))
            hit = self._verified[key] = (tenant_id, time.monotonic())
        policy = self._policies.get(hit[0])
        if policy is None:
            policy = self._policies[hit[0]] = TenantEgressPolicy(hit[0], refresh_s=self.refresh_s, db=self._db)
        return policy

    async def close(self) -> None:
        await _close_executor(self._db, _FLEET_DB_THREADS)


async def start_egress_proxy(*, tenant_id: object = None, listen: str | tuple[str, int] | socket.socket,
                             limits: ProxyLimits | None = None
                             ) -> tuple[asyncio.Server, TenantEgressPolicy | FleetTenants]:
    """Start ``tenant_id``'s egress proxy, or without a tenant the machine's (``FleetTenants``), on ``listen`` (a unix
    socket path, ``(host, port)`` or a bound socket the sandbox built) in the running loop. Returns the server and
    its policy: ``server.close()`` then ``await policy.close()`` to stop."""
    limits = limits or limits_from_settings()
    if tenant_id is None:
        fleet = FleetTenants()
        return await start_proxy(listen, limits=limits, tenants=fleet), fleet
    policy = TenantEgressPolicy(tenant_id)
    return await start_proxy(listen, policy, limits), policy


def run_egress_proxy(*, tenant_id: object = None, listen: str, ready: Any = None) -> None:
    """Block serving one tenant (or, without ``tenant_id``, every tenant by its credential) until SIGTERM or SIGINT
    (``manage.py egress_proxy``). ``ready(server)`` is called once listening (the command prints the address)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        server, policy = await start_egress_proxy(tenant_id=tenant_id, listen=listen_parse(listen))
        try:
            if ready is not None:
                ready(server)
            await stop.wait()
        finally:
            server.close()
            await server.wait_closed()
            await policy.close()

    asyncio.run(main())
