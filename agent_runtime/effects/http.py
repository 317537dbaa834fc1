"""HTTP effects with an `Idempotency-Key` header: the convention of Stripe, Adyen and most payment and
messaging APIs.

The key goes in a header on every attempt. What happens when the outcome is unknown is configured, not
guessed: `lookup_url` (a template with `{key}`) asks the provider for the record of a key — an empty `data`
list (a search) means it has no record; a 404 from the lookup endpoint is "cannot tell" (a wrong URL or a
provider without that endpoint must never read as "never received"). `lookup_consistency_s` declares how long
after an attempt that answer may still be behind (search APIs index with a delay: Stripe documents under a
minute); within that window "absent" is not trusted. A provider that documents a status of its lookup
endpoint as "no record for this key" names it in `lookup_absent_status`. `replay_safe=True` says the provider
answers a repeated key from its own record (Stripe keeps that record for at least 24 hours), so the same
request may be sent again; with neither, an effect in doubt waits for a human.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from agent_runtime.effects.base import LookupResult, ProviderRejected, ProviderUnreachable

__all__ = ["HttpIdempotentEffect"]

# 4xx answers that do not mean "refused for good": 408 timeout and 409 a concurrent request with the same key
# (outcome still unknown), 429 rate limited (not processed).
_NOT_A_REFUSAL = {408, 409, 429}


def _set_path(body: dict[str, Any], dotted: str, value: str) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    node = out
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return dict(out)


def _unreached(exc: BaseException) -> bool:
    """True only when the request certainly never left: refused connection or an unresolvable name."""
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, ConnectionRefusedError | socket.gaierror)


class HttpIdempotentEffect:
    """POST (or `method`) JSON to `url` with the idempotency key in `key_header`."""

    def __init__(self, url: str, *, method: str = "POST", lookup_url: str | None = None, replay_safe: bool = False,
                 key_header: str = "Idempotency-Key", key_body_field: str | None = None,
                 headers: Mapping[str, str] | None = None, credentials: Any = None,
                 bearer_credential: str | None = None, lookup_consistency_s: float = 0.0,
                 lookup_absent_status: int | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        self.method = method
        self.lookup_url = lookup_url
        self.replay_safe = replay_safe
        self.supports_lookup = lookup_url is not None
        if lookup_consistency_s < 0:
            raise ValueError("lookup_consistency_s must be 0 or more seconds")
        self.lookup_consistency_s = float(lookup_consistency_s)
        self.lookup_absent_status = lookup_absent_status
        self.key_header = key_header
        self.key_body_field = key_body_field
        self.headers = dict(headers or {})
        self.credentials = credentials
        self.bearer_credential = bearer_credential
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return (f"HttpIdempotentEffect({self.url!r}, lookup={self.supports_lookup}, "
                f"lookup_consistency_s={self.lookup_consistency_s}, replay_safe={self.replay_safe})")

    def _auth(self) -> dict[str, str]:
        if not self.bearer_credential:
            return {}
        # Fetched at the moment of use, so a revoked key stops the next call; never stored or logged.
        return {"Authorization": f"Bearer {self.credentials.get(self.bearer_credential).value}"}

    def _open(self, req: urllib.request.Request) -> tuple[int, Any]:
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - configured provider
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else {}

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        body = _set_path(args, self.key_body_field, idem_key) if self.key_body_field else args
        req = urllib.request.Request(  # noqa: S310 - configured provider
            self.url, data=json.dumps(body).encode(), method=self.method,
            headers={"Content-Type": "application/json", "Accept": "application/json", **self.headers,
                     **self._auth(), self.key_header: idem_key})
        try:
            _status, answer = self._open(req)
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            if exc.code == 429:
                raise ProviderUnreachable(f"rate limited (429): {detail}") from exc
            if 400 <= exc.code < 500 and exc.code not in _NOT_A_REFUSAL:
                raise ProviderRejected(f"{exc.code}: {detail}") from exc
            raise  # 5xx, 408, 409: outcome unknown
        except urllib.error.URLError as exc:
            if _unreached(exc):
                raise ProviderUnreachable(str(exc.reason)) from exc
            raise
        except (ConnectionRefusedError, socket.gaierror) as exc:
            raise ProviderUnreachable(str(exc)) from exc
        return answer if isinstance(answer, dict) else {"response": answer}

    def lookup(self, idem_key: str) -> LookupResult:
        assert self.lookup_url is not None
        req = urllib.request.Request(  # noqa: S310 - configured provider
            self.lookup_url.replace("{key}", quote(idem_key, safe="")),
            headers={"Accept": "application/json", **self.headers, **self._auth()})
        try:
            _status, answer = self._open(req)
        except urllib.error.HTTPError as exc:
            if self.lookup_absent_status is not None and exc.code == self.lookup_absent_status:
                return LookupResult.absent()  # the provider documents this answer as "no record for this key"
            # Otherwise even a 404 is "cannot tell": it may name a missing endpoint, not a missing record.
            return LookupResult.unknown(f"lookup answered {exc.code}")
        if isinstance(answer, dict) and isinstance(answer.get("data"), list):  # a search or list response
            return LookupResult.found(answer["data"][0]) if answer["data"] else LookupResult.absent()
        if isinstance(answer, dict):
            return LookupResult.found(answer)
        return LookupResult.unknown("lookup answer is not a JSON object")
