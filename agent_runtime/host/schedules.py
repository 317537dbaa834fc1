"""The agent's own schedules (`ctx.schedule`) as an effect adapter: the control plane makes the schedule.

`POST {url}/internal/v1/schedules` with the instance token and the ledger's idempotency key in `Idempotency-Key`;
the control plane keeps the key with the schedule, unique per tenant, so the same key asked again answers with
the schedule it made (`replay_safe`), and `GET .../schedules/by-key/{key}` says whether one was made (`lookup`,
true at once: the key commits with the schedule). So an intent in doubt after a kill is settled without a human:
found, it is committed with the control plane's answer; absent, it is made now, once.

What the control plane's answer means to the ledger: 400 (a bad cron, zone or moment), 404 and 409 (a name taken,
the customer's limit reached) are refusals: nothing was made; 401, 403 and 429, and a refused connection, never
made anything either, so the call is safe to make again later; anything else (a timeout, a 5xx) is "outcome
unknown", for the lookup to settle.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from agent_runtime.effects.base import LookupResult, ProviderRejected, ProviderUnreachable
from agent_runtime.internal_api import InternalApiUnavailable, internal_get_json, internal_post_json

__all__ = ["SCHEDULE_EFFECT", "ControlPlaneSchedules"]

# The effect name `ctx.schedule` records its calls under (in the ledger, the effects API and the portal).
SCHEDULE_EFFECT = "schedule"

_REFUSED = {400, 404, 409, 413, 422}
_NOT_ARRIVED = {401, 403, 429}


class ControlPlaneSchedules:
    """An `EffectAdapter` (effects.base) whose provider is the control plane's schedules."""

    supports_lookup = True
    replay_safe = True
    lookup_consistency_s = 0.0

    def __init__(self, base_url: str, token: str, timeout_s: float = 15.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ControlPlaneSchedules({self.base_url!r})"

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = internal_post_json(self.base_url, self._token, "/internal/v1/schedules", args,
                                        timeout_s=self.timeout_s, headers={"Idempotency-Key": idem_key})
        except InternalApiUnavailable as exc:
            if exc.status in _REFUSED:
                raise ProviderRejected(f"the control plane refused the schedule ({exc.why})") from None
            if exc.unreached or exc.status in _NOT_ARRIVED:
                raise ProviderUnreachable(f"the control plane did not take the schedule ({exc.why})") from None
            raise  # outcome unknown: the lookup by key settles it
        if not isinstance(answer, dict) or "id" not in answer:
            raise ValueError("the control plane's answer to a schedule is not a schedule")
        return answer

    def lookup(self, idem_key: str) -> LookupResult:
        try:
            answer = internal_get_json(self.base_url, self._token,
                                       f"/internal/v1/schedules/by-key/{quote(idem_key, safe='')}",
                                       timeout_s=self.timeout_s)
        except InternalApiUnavailable as exc:
            if exc.status == 404:
                return LookupResult.absent()  # documented: no schedule was ever made under this key
            return LookupResult.unknown(exc.why)
        if not isinstance(answer, dict) or "id" not in answer:
            return LookupResult.unknown("the control plane's answer is not a schedule")
        return LookupResult.found(answer)
