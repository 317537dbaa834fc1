"""Secrets a feature keeps wrapped by the key-encryption key itself (not sealed with a tenant's data key), registered
from the feature's ``AppConfig.ready()`` so a KEK rotation re-wraps them too: an OAuth client's secret
(connections), a webhook endpoint's signing secret (webhooks); ``vault.wrapped_rows`` makes the entry for such
rows. The vault sits below those features and never imports them; each hands its rows over through a
``WrappedSecrets`` entry. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["WrappedSecrets", "wrapped_secrets_register", "wrapped_secrets_sources"]


@dataclass(frozen=True)
class WrappedSecrets:
    """``rewrap(target_kek_id)``: re-wrap every row not yet under ``target_kek_id``, each under its row lock and
    idempotent (a row already under the target is left alone), returning how many it re-wrapped;
    ``kek_ids()``: the key-encryption keys its rows are wrapped by now (what may not leave the ring yet)."""

    name: str
    rewrap: Callable[[str], int]
    kek_ids: Callable[[], set[str]]


_sources: dict[str, WrappedSecrets] = {}


def wrapped_secrets_register(source: WrappedSecrets) -> None:
    _sources[source.name] = source


def wrapped_secrets_sources() -> list[WrappedSecrets]:
    return list(_sources.values())
