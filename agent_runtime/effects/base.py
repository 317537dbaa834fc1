"""The contract between the effect ledger and a provider adapter. No I/O here.

An adapter performs one irreversible call with the ledger's idempotency key, passed to the provider in the
provider's own convention (an `Idempotency-Key` header, a `Message-ID`, a webhook id). What the ledger does
with an intent whose outcome is unknown depends on what the provider can tell or promise:

- `lookup(key)` (when `supports_lookup`): the provider is asked; FOUND commits the recorded answer, UNKNOWN
  (or an error during the lookup) leaves the effect in doubt and the lookup is asked again later with backoff;
  ABSENT is trusted only when the provider could have known: `lookup_consistency_s` declares how long after
  an attempt the lookup may still miss what that attempt did (0: at once, e.g. an idempotency record written
  with the effect; a search API's indexing delay otherwise: Stripe documents under a minute). Before the
  window has passed since the last attempt, ABSENT leaves the effect in doubt (or, when `replay_safe`, repeats
  it with the same key); after it, the call is made now (first delivery);
- `replay_safe`: the provider documents that a repeat with the same key is answered from its own record
  without acting twice (Stripe's idempotent requests, webhook receivers that de-duplicate by id); the ledger
  then repeats the call with the same key;
- neither: the effect is blocked for a human decision. Never a blind retry.

Errors an adapter raises from `perform`: `ProviderRejected` (the provider answered and refused: nothing
happened), `ProviderUnreachable` (the request certainly never reached the provider: connection refused,
name resolution), anything else means "outcome unknown".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["EffectAdapter", "LookupResult", "ProviderRejected", "ProviderUnreachable"]


class ProviderRejected(Exception):
    """The provider answered and definitively refused (the effect did not happen)."""


class ProviderUnreachable(Exception):
    """The request never reached the provider (connect refused, DNS): the effect certainly did not happen."""


@dataclass(frozen=True)
class LookupResult:
    """The provider's answer about one idempotency key."""

    outcome: Literal["found", "absent", "unknown"]
    result: dict[str, Any] | None = None
    detail: str = ""

    @classmethod
    def found(cls, result: dict[str, Any]) -> LookupResult:
        return cls("found", dict(result))

    @classmethod
    def absent(cls) -> LookupResult:
        return cls("absent")

    @classmethod
    def unknown(cls, detail: str) -> LookupResult:
        return cls("unknown", None, detail)


@runtime_checkable
class EffectAdapter(Protocol):
    """An irreversible external call. `perform` must pass `idem_key` to the provider."""

    supports_lookup: bool
    replay_safe: bool
    # Seconds after an attempt during which the lookup's "absent" cannot be trusted (0: trusted at once).
    lookup_consistency_s: float

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]: ...

    def lookup(self, idem_key: str) -> LookupResult:
        """What the provider knows of `idem_key` (only called when `supports_lookup`)."""
        ...
