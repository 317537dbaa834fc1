"""Rows that keep one secret wrapped by the key-encryption key in three fields (``secret_kek_id``, ``secret_blob``,
``secret_fingerprint``), bound to a context string of the row: an OAuth client's secret (connections), a webhook
endpoint's signing secret (webhooks). One way to wrap, unwrap and re-wrap them, so a feature with such a row only
names its model and its context and registers the result with ``vault.wrapped_secrets``.

The vault sits below those features: the model class is handed in, never imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import models, transaction

from .kek import WrappedKey, kek_provider, kek_unwrap
from .wrapped_secrets import WrappedSecrets

__all__ = ["row_secret_read", "row_secret_wrap", "wrapped_rows_source"]


def row_secret_wrap(row: Any, context: str, secret: str) -> None:
    """Set the row's three fields to ``secret`` wrapped by the current key-encryption key (the caller saves)."""
    wrapped = kek_provider().wrap(context, secret.encode())
    row.secret_kek_id, row.secret_blob = wrapped.kek_id, wrapped.blob
    row.secret_fingerprint = wrapped.fingerprint or ""


def row_secret_read(row: Any, context: str) -> str:
    """The row's secret in the clear ("" when it holds none). A blob copied onto another row does not unwrap:
    the context names the row."""
    if not row.secret_kek_id:
        return ""
    wrapped = WrappedKey(row.secret_kek_id, bytes(row.secret_blob), row.secret_fingerprint or None)
    return kek_unwrap(context, wrapped).decode()


def wrapped_rows_source(name: str, model: type[models.Model], context: Callable[[Any], str]) -> WrappedSecrets:
    """The ``WrappedSecrets`` of every ``model`` row with a secret: a KEK rotation re-wraps each row not yet under
    its target, under the row's lock and in its own commit, skipping a row already there, so a rotation resumed
    after a kill re-wraps nothing twice; ``kek_ids`` names the keys the rows are wrapped by now."""
    manager = model._default_manager

    def rewrap(target_kek_id: str) -> int:
        rewrapped = 0
        stale = manager.exclude(secret_kek_id="").exclude(secret_kek_id=target_kek_id)
        for pk in list(stale.values_list("pk", flat=True)):
            with transaction.atomic():
                row = manager.select_for_update().get(pk=pk)
                if not row.secret_kek_id or row.secret_kek_id == target_kek_id:
                    continue
                row_secret_wrap(row, context(row), row_secret_read(row, context(row)))
                fields = ["secret_kek_id", "secret_blob", "secret_fingerprint"]
                if any(f.name == "updated_at" for f in model._meta.get_fields()):
                    fields.append("updated_at")
                row.save(update_fields=fields)
                rewrapped += 1
        return rewrapped

    def kek_ids() -> set[str]:
        return set(manager.exclude(secret_kek_id="").values_list("secret_kek_id", flat=True))

    return WrappedSecrets(name=name, rewrap=rewrap, kek_ids=kek_ids)
