"""Credential sources. Credentials live in memory only, are fetched from the source of truth at the
moment of use (never from a checkpoint), and their values never appear in repr, logs or the database."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

from agent_runtime.errors import CredentialUnavailable
from agent_runtime.internal_api import InternalApiUnavailable, internal_get_json

__all__ = ["ControlPlaneCredentialSource", "Credential", "CredentialSource", "EnvCredentialSource",
           "InMemoryCredentialSource", "RecordingCredentialSource"]


@dataclass(frozen=True)
class Credential:
    name: str
    version: int
    value: str = field(repr=False)


class CredentialSource(Protocol):
    def get(self, name: str) -> Credential:
        """The credential as the source of truth holds it now; CredentialUnavailable if absent/revoked."""
        ...

    def available(self, name: str) -> bool:
        """Whether `get(name)` would succeed now, without reading the value (a one-time credential stays
        unconsumed): how the host finds out that a credential a blocked task waits for was stored."""
        ...


class InMemoryCredentialSource:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self._values: dict[str, Credential] = {k: Credential(k, 1, v) for k, v in (values or {}).items()}
        # Versions keep counting across a revocation, as the vault's do: a re-grant is never the old grant.
        self._last_version: dict[str, int] = {k: 1 for k in self._values}

    def set(self, name: str, value: str) -> None:
        version = self._last_version.get(name, 0) + 1
        self._last_version[name] = version
        self._values[name] = Credential(name, version, value)

    def revoke(self, name: str) -> None:
        self._values.pop(name, None)

    def available(self, name: str) -> bool:
        return name in self._values

    def get(self, name: str) -> Credential:
        try:
            return self._values[name]
        except KeyError:
            raise CredentialUnavailable(f"credential {name!r} is not available (absent or revoked)",
                                        name=name) from None


class RecordingCredentialSource:
    """`source`, noting the (name, version) of every credential it hands out in each recording open at that
    moment: what a tool's fetch reads becomes the authority its cached output is served under (`Context.tool`).
    Only names and versions are noted, never values."""

    def __init__(self, source: CredentialSource,
                 recordings: Callable[[], Iterable[set[tuple[str, int]]]]) -> None:
        self.source = source
        self._recordings = recordings

    def __repr__(self) -> str:
        return f"RecordingCredentialSource({self.source!r})"

    def available(self, name: str) -> bool:
        return self.source.available(name)

    def get(self, name: str) -> Credential:
        credential = self.source.get(name)
        for reads in self._recordings():
            reads.add((credential.name, credential.version))
        return credential


class EnvCredentialSource:
    """`AGENT_CREDENTIAL_<NAME>` (upper case, '-' and '.' as '_'); read at every use."""

    @staticmethod
    def _var(name: str) -> str:
        return "AGENT_CREDENTIAL_" + name.upper().replace("-", "_").replace(".", "_")

    def available(self, name: str) -> bool:
        return self._var(name) in os.environ

    def get(self, name: str) -> Credential:
        var = self._var(name)
        value = os.environ.get(var)
        if value is None:
            raise CredentialUnavailable(f"credential {name!r} is not available ({var} unset)", name=name)
        return Credential(name, 1, value)


class ControlPlaneCredentialSource:
    """`GET {url}/internal/v1/credentials/{name}` with the instance token; 404/410 means revoked."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ControlPlaneCredentialSource({self.base_url!r})"

    def available(self, name: str) -> bool:
        """`HEAD` on the same URL: 204 or 404, no value sent, nothing consumed or audited; any failure is "not
        yet" (asked again at the next heartbeat)."""
        req = urllib.request.Request(  # noqa: S310 - URL comes from the operator's configuration
            f"{self.base_url}/internal/v1/credentials/{quote(name, safe='')}", method="HEAD",
            headers={"Authorization": f"Bearer {self._token}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return bool(200 <= resp.status < 300)
        except (urllib.error.URLError, TimeoutError, ValueError):
            return False

    def get(self, name: str) -> Credential:
        try:
            body = internal_get_json(self.base_url, self._token, f"/internal/v1/credentials/{quote(name, safe='')}",
                                     timeout_s=self.timeout_s)
        except InternalApiUnavailable as exc:
            raise CredentialUnavailable(f"credential {name!r} unavailable: {exc.why}", name=name) from None
        try:
            return Credential(str(body["name"]), int(body["version"]), str(body["value"]))
        except (KeyError, TypeError, ValueError):
            raise CredentialUnavailable(f"credential {name!r}: malformed answer from control plane",
                                        name=name) from None
