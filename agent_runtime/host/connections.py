"""Connected-account sources: a customer's account at a provider (Google, Slack, a CRM), connected through OAuth in
the control plane, as a current access token. Like credentials, a token lives in memory only, is asked for at the
moment of use (never checkpointed, never cached here: the control plane refreshes it) and never appears in repr,
logs, exceptions or the database.

No refresh happens here: the refresh token never leaves the control plane, which refreshes under its single-flight
lock, so two instances (or a restart mid-refresh) can never spend one refresh token twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

from agent_runtime.errors import ConnectionUnavailable
from agent_runtime.internal_api import InternalApiUnavailable, internal_get_json, internal_head_ok

__all__ = ["AccessToken", "ConnectionSource", "ControlPlaneConnectionSource", "EnvConnectionSource",
           "TaskConnectionSource"]


@dataclass(frozen=True)
class AccessToken:
    provider: str
    value: str = field(repr=False)
    expires_at: str | None = None  # ISO 8601, as the control plane says; None when the provider gave no lifetime
    account_id: str = ""
    scopes: tuple[str, ...] = ()


class ConnectionSource(Protocol):
    def token(self, provider: str, task_id: str | None = None) -> AccessToken:
        """A current access token of the tenant's connection to `provider`; ConnectionUnavailable otherwise.
        `task_id`: the task asking; the control plane picks the connection of the end user it recorded for that
        task (docs/connections.md), the source never names an end user."""
        ...

    def available(self, provider: str, task_id: str | None = None) -> bool:
        """Whether `token(provider, task_id)` would succeed now, without fetching one: how the host finds out that
        the customer connected again an account a blocked task waits for."""
        ...


@dataclass(frozen=True)
class TaskConnectionSource:
    """The instance's source as one task's steps see it: every request names that task, so the control plane
    hands out the connection of the end user it recorded for the task. The task is fixed here: a step's code
    asks for a provider, never for a person."""

    source: ConnectionSource
    task_id: str | None

    def token(self, provider: str, task_id: str | None = None) -> AccessToken:
        return self.source.token(provider, task_id=self.task_id)

    def available(self, provider: str, task_id: str | None = None) -> bool:
        return self.source.available(provider, task_id=self.task_id)


class EnvConnectionSource:
    """`AGENT_CONNECTION_<PROVIDER>` holds an access token (upper case, '-' and '.' as '_'): for running an agent
    without a control plane (development, tests). Read at every use."""

    @staticmethod
    def _var(provider: str) -> str:
        return "AGENT_CONNECTION_" + provider.upper().replace("-", "_").replace(".", "_")

    def available(self, provider: str, task_id: str | None = None) -> bool:
        return bool(os.environ.get(self._var(provider)))

    def token(self, provider: str, task_id: str | None = None) -> AccessToken:
        value = os.environ.get(self._var(provider))
        if not value:
            raise ConnectionUnavailable(f"no {provider!r} connection ({self._var(provider)} unset)",
                                        provider=provider, transient=False)
        return AccessToken(provider, value)


class ControlPlaneConnectionSource:
    """`GET {url}/internal/v1/connections/{provider}` with the instance token: the control plane answers only for
    the token's own tenant. 404 (not connected), 409 (needs the customer) and 403 (the agents of this release did
    not declare the provider: ``Agent(connections=[...])``) block; anything else is transient."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 15.0) -> None:
        # Longer than a credential's: the control plane may refresh at the provider before it answers.
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ControlPlaneConnectionSource({self.base_url!r})"

    def _path(self, provider: str, task_id: str | None) -> str:
        path = f"/internal/v1/connections/{quote(provider, safe='')}"
        return path if task_id is None else f"{path}?task={quote(str(task_id), safe='')}"

    def available(self, provider: str, task_id: str | None = None) -> bool:
        return internal_head_ok(self.base_url, self._token, self._path(provider, task_id), timeout_s=self.timeout_s)

    def token(self, provider: str, task_id: str | None = None) -> AccessToken:
        try:
            body = internal_get_json(self.base_url, self._token, self._path(provider, task_id),
                                     timeout_s=self.timeout_s)
        except InternalApiUnavailable as exc:
            needs_customer = exc.status in (403, 404, 409, 410)
            what = {403: "is not declared by this release's agents (Agent(connections=[...]))",
                    404: "is not connected", 409: "needs the customer to connect it again",
                    410: "is not connected"}.get(exc.status or 0, f"is unavailable now ({exc.why})")
            raise ConnectionUnavailable(f"the {provider!r} connection {what}", provider=provider,
                                        transient=not needs_customer) from None
        try:
            return AccessToken(provider=str(body["provider"]), value=str(body["access_token"]),
                               expires_at=body.get("expires_at"), account_id=str(body.get("account_id") or ""),
                               scopes=tuple(str(s) for s in body.get("scopes") or ()))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConnectionUnavailable(f"the {provider!r} connection: malformed answer from the control plane",
                                        provider=provider, transient=True) from None
