"""`ctx.connections`: the customer's connected accounts (OAuth, connected in the control plane), as access tokens.

    token = ctx.connections.get("google").access_token()   # a str, current, asked for now

A token is asked for at every `access_token()` call: the control plane hands out a current one (refreshing it
first when near expiry), so a step never holds one past its life and a restart needs nothing restored. A
connection that needs the customer (refused refresh, disconnected, never connected) raises ConnectionUnavailable:
the task is blocked `connection_needs_reauth` naming the provider, and resumes by itself once the customer
connects again.
"""

from __future__ import annotations

from agent_runtime.host.connections import AccessToken, ConnectionSource

__all__ = ["ConnectedAccount", "Connections"]


class ConnectedAccount:
    """One provider's connection of this tenant. Holds no token: each call asks for a current one."""

    def __init__(self, source: ConnectionSource, provider: str) -> None:
        self._source = source
        self.provider = provider

    def __repr__(self) -> str:
        return f"ConnectedAccount({self.provider!r})"

    def access_token(self) -> str:
        """A current access token (send it as `Authorization: Bearer ...`); ConnectionUnavailable otherwise."""
        return self._source.token(self.provider).value

    def token(self) -> AccessToken:
        """The token with what the control plane says of it: `expires_at`, `account_id`, `scopes`."""
        return self._source.token(self.provider)


class Connections:
    def __init__(self, source: ConnectionSource) -> None:
        self._source = source

    def __repr__(self) -> str:
        return "Connections()"

    def get(self, provider: str) -> ConnectedAccount:
        """The tenant's connection to `provider` (the provider name the operator registered its OAuth client
        under, e.g. "google"). Nothing is fetched until `access_token()`."""
        if not isinstance(provider, str) or not provider or len(provider) > 60:
            raise ValueError(f"a provider name is 1-60 characters, not {provider!r}")
        return ConnectedAccount(self._source, provider)
