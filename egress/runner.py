"""The entry point the sandbox wiring calls: one tenant's egress proxy on a given socket, backed by PostgreSQL.

``start_egress_proxy(tenant_id=..., listen=...)`` inside a running event loop returns the asyncio server (close it
to stop); ``run_egress_proxy`` blocks (``manage.py egress_proxy``). The database is reached from one thread per
proxy (``TenantEgressPolicy``): the ORM is synchronous, and one thread bounds the proxy's database connections
to one whatever its traffic. The allow-list is re-read at most every ``EGRESS_RULES_REFRESH_S``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connections

from .proxy import Decision, ProxyLimits, start_proxy
from .rules import AllowList
from .selectors import allow_list_for_tenant
from .services import decision_record

__all__ = ["TenantEgressPolicy", "limits_from_settings", "listen_parse", "run_egress_proxy", "start_egress_proxy"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def limits_from_settings(**overrides: Any) -> ProxyLimits:
    values: dict[str, Any] = {
        "max_connections": settings.EGRESS_MAX_CONNECTIONS,
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

    def __init__(self, tenant_id: object, *, refresh_s: float | None = None) -> None:
        self.tenant_id = uuid.UUID(str(tenant_id))  # ValueError now, not a refused request later
        self.refresh_s = settings.EGRESS_RULES_REFRESH_S if refresh_s is None else refresh_s
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"egress-db-{tenant_id}")
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
        await asyncio.get_running_loop().run_in_executor(self._db, connections.close_all)
        self._db.shutdown(wait=True)


async def start_egress_proxy(*, tenant_id: object, listen: str | tuple[str, int] | socket.socket,
                             limits: ProxyLimits | None = None) -> tuple[asyncio.Server, TenantEgressPolicy]:
    """Start ``tenant_id``'s egress proxy on ``listen`` (a unix socket path, ``(host, port)`` or a bound socket the
    sandbox built) in the running loop. Returns the server and its policy: ``server.close()`` then
    ``await policy.close()`` to stop."""
    policy = TenantEgressPolicy(tenant_id)
    server = await start_proxy(listen, policy, limits or limits_from_settings())
    return server, policy


def run_egress_proxy(*, tenant_id: object, listen: str, ready: Any = None) -> None:
    """Block serving one tenant until SIGTERM or SIGINT (``manage.py egress_proxy``). ``ready(server)`` is called
    once listening (the command prints the address)."""

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
