"""DRF throttles that count per operator (or per instance) in the shared cache (Redis in production).

One fixed-window counter per (scope, principal, window), incremented atomically (``INCR``), so
concurrent requests on any number of web processes cannot slip past a limit the way a read-modify-
write history can, and one operator's burst never touches another operator's counter. Rates come
from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (read per request, so tests and settings changes
apply at once). A request with no operator or instance principal is not counted here: permissions
have refused it before throttles run. Quotas are not throttles: ``tenant_onboard`` enforces those.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.redis import RedisCache
from django.utils.connection import ConnectionProxy
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

__all__ = [
    "PrincipalRateThrottle", "OperatorThrottle", "OnboardingThrottle", "CredentialsThrottle",
    "InstanceCredentialsThrottle", "principal_key",
]


def principal_key(request: Any) -> str | None:
    """``op:<operator id>`` or ``inst:<instance id>`` for the authenticated caller, else None."""
    user = getattr(request, "user", None)
    operator = getattr(user, "operator", None)
    if operator is not None:
        return f"op:{operator.pk}"
    instance = getattr(user, "instance", None)
    if instance is not None:
        return f"inst:{instance.pk}"
    return None


class PrincipalRateThrottle(SimpleRateThrottle):
    scope = ""
    methods: frozenset[str] | None = None  # None: every method

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        key = principal_key(request)
        return None if key is None else f"throttle:{self.scope}:{key}"

    def allow_request(self, request: Any, view: Any) -> bool:
        self._wait = 0.0
        if self.rate is None or (self.methods is not None and request.method not in self.methods):
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = time.time()
        window = int(now // self.duration)
        count = self._count(f"{key}:{window}", timeout=self.duration + 5)
        if count > self.num_requests:
            self._wait = (window + 1) * self.duration - now
            return False
        return True

    def _count(self, counter: str, *, timeout: int) -> int:
        """This window's counter, incremented. On Redis one round trip (INCR and EXPIRE pipelined: issue 39, the
        cache API's add, then incr's EXISTS and INCR, cost three per request); elsewhere through the cache API."""
        cache = _backend_of(self.cache)
        backend = getattr(cache, "_cache", None)
        if isinstance(cache, RedisCache) and backend is not None:
            key = cache.make_and_validate_key(counter)
            pipe = backend.get_client(key, write=True).pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, timeout)
            return int(pipe.execute()[0])
        self.cache.add(counter, 0, timeout=timeout)
        try:
            return int(self.cache.incr(counter))
        except ValueError:  # expired between add and incr
            self.cache.add(counter, 1, timeout=timeout)
            return 1

    def wait(self) -> float | None:
        return max(self._wait, 1.0) if self._wait else None


def _backend_of(cache: Any) -> BaseCache:
    """The cache backend behind ``cache``. DRF's throttles hold ``django.core.cache.cache``, a ``ConnectionProxy``
    that no ``isinstance`` check sees through: the Redis fast path above was never taken (three round trips per
    request, found profiling issue 39's message inside gunicorn)."""
    if isinstance(cache, ConnectionProxy):
        return cache._connections[cache._alias]  # the proxy's own lookup
    return cache


class OperatorThrottle(PrincipalRateThrottle):
    """Every operator API call."""

    scope = "operator"


class OnboardingThrottle(PrincipalRateThrottle):
    """Onboarding requests (``POST /api/v1/tenants``)."""

    scope = "onboarding"
    methods = frozenset({"POST"})


class CredentialsThrottle(PrincipalRateThrottle):
    """The operator credential API."""

    scope = "credentials"


class InstanceCredentialsThrottle(PrincipalRateThrottle):
    """Credential and object-key delivery to an instance."""

    scope = "instance-credentials"
