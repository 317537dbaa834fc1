"""Effect ledger for irreversible calls (email, payment, webhook).

Before the call an intent is committed with an idempotency key derived from the logical step
(task, step, effect name), never from the arguments. After the call the result is committed. On replay a
committed effect returns its recorded result without calling, whatever arguments the replay produced.
An intent without outcome is *in doubt*: it is resolved by asking the provider by idempotency key when
the effect supports that; otherwise the effect is marked blocked and the task waits for a human.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.codec import canonical_json, sha256_hex
from agent_runtime.errors import EffectFailed, EffectInDoubt, TaskBlocked

__all__ = ["Effect", "EffectLedger", "EffectRecord", "ProviderRejected", "idempotency_key"]

log = logging.getLogger("agent_runtime.ledger")


class ProviderRejected(Exception):
    """The provider answered and definitively refused (the effect did not happen)."""


class Effect(Protocol):
    """An irreversible external call. `perform` must pass `idem_key` to the provider."""

    name: str
    supports_lookup: bool

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]: ...

    def lookup(self, idem_key: str) -> dict[str, Any] | None:
        """The provider's record for `idem_key`, or None if it never received it."""
        ...


@dataclass(frozen=True)
class EffectRecord:
    id: int
    task_id: UUID
    step: str
    effect: str
    idem_key: str
    args: dict[str, Any]
    state: str
    result: dict[str, Any] | None
    resolution: str | None


def idempotency_key(task_id: UUID | str, step: str, effect: str) -> str:
    """Derived from the logical step only: regenerated arguments cannot produce a new key."""
    return "eff-" + sha256_hex(f"{task_id}\x00{step}\x00{effect}")[:40]


_COLS = "id, task_id, step, effect, idem_key, args, state, result, resolution"


def _rec(row: tuple[Any, ...]) -> EffectRecord:
    return EffectRecord(int(row[0]), row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8])


class EffectLedger:
    """Ledger access on an autocommit connection: intent and outcome are separate committed facts."""

    def __init__(self, conn: psycopg.Connection) -> None:
        if not conn.autocommit:
            raise ValueError("EffectLedger needs an autocommit connection: intents must commit before the call")
        self.conn = conn

    def get(self, idem_key: str) -> EffectRecord | None:
        row = self.conn.execute(f"SELECT {_COLS} FROM effects WHERE idem_key = %s", (idem_key,)).fetchone()  # noqa: S608
        return _rec(row) if row else None

    def position(self, task_id: UUID) -> int:
        row = self.conn.execute(
            "SELECT coalesce(max(id), 0) FROM effects WHERE task_id = %s AND state = 'committed'", (task_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def open_effects(self) -> list[EffectRecord]:
        rows = self.conn.execute(
            f"SELECT {_COLS} FROM effects WHERE state IN ('intent', 'blocked') ORDER BY id"  # noqa: S608
        ).fetchall()
        return [_rec(r) for r in rows]

    def count(self, task_id: UUID, state: str = "committed") -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM effects WHERE task_id = %s AND state = %s", (task_id, state)
        ).fetchone()
        return int(row[0]) if row else 0

    def _settle(self, rec_id: int, state: str, result: dict[str, Any] | None, resolution: str) -> None:
        self.conn.execute(
            "UPDATE effects SET state = %s, result = %s, resolution = %s, settled_at = clock_timestamp()"
            " WHERE id = %s",
            (state, Jsonb(result) if result is not None else None, resolution, rec_id),
        )

    def run(self, task_id: UUID, step: str, effect: Effect, args: dict[str, Any]) -> dict[str, Any]:
        """Perform `effect` at most once for (task, step, effect name); return its recorded result."""
        key = idempotency_key(task_id, step, effect.name)
        digest = sha256_hex(canonical_json(args))
        rec = self.get(key)
        if rec is None:
            row = self.conn.execute(
                "INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state)"
                " VALUES (%s, %s, %s, %s, %s, %s, 'intent') ON CONFLICT (idem_key) DO NOTHING RETURNING id",
                (task_id, step, effect.name, key, Jsonb(args), digest),
            ).fetchone()
            if row is None:  # lost a race with another writer: treat as replay
                return self.run(task_id, step, effect, args)
            return self._perform(int(row[0]), key, effect, args, resolution="performed")
        if rec.args != args:
            log.warning("effect replay with different arguments ignored; recorded result returned",
                        extra={"event": "effect_args_mismatch", "effect": effect.name, "idem_key": key,
                               "task_id": str(task_id), "step": step})
        if rec.state == "committed":
            assert rec.result is not None
            return rec.result
        if rec.state == "failed":
            raise EffectFailed(f"effect {effect.name} of step {step} was refused earlier: {rec.result}")
        if rec.state == "blocked":
            raise TaskBlocked("effect_in_doubt", f"{effect.name} ({key}) awaits a human decision")
        # state == 'intent': in doubt unless a human ordered a retry.
        if rec.resolution == "human:retry":
            return self._perform(rec.id, key, effect, rec.args, resolution="human:retry:performed")
        return self.resolve(rec, effect)

    def _perform(self, rec_id: int, key: str, effect: Effect, args: dict[str, Any], resolution: str) -> dict[str, Any]:
        try:
            result = effect.perform(key, args)
        except ProviderRejected as exc:
            self._settle(rec_id, "failed", {"error": str(exc)}, resolution)
            raise EffectFailed(f"provider refused {effect.name}: {exc}") from exc
        except Exception as exc:
            # Outcome unknown (timeout, connection reset): the intent stays in doubt; never blindly retried.
            raise EffectInDoubt(f"{effect.name} ({key}) outcome unknown: {exc}") from exc
        self._settle(rec_id, "committed", result, resolution)
        return result

    def resolve(self, rec: EffectRecord, effect: Effect) -> dict[str, Any]:
        """Resolve an in-doubt intent: ask the provider by key, else block for a human."""
        if not effect.supports_lookup:
            self._settle(rec.id, "blocked", None, "no_provider_lookup")
            raise TaskBlocked("effect_in_doubt", f"{effect.name} ({rec.idem_key}): provider cannot be asked")
        found = effect.lookup(rec.idem_key)
        if found is not None:
            self._settle(rec.id, "committed", found, "provider_lookup:found")
            return found
        # The provider never received it (the process died before the call landed): performing now is
        # the first and only delivery, with the arguments recorded in the intent.
        return self._perform(rec.id, rec.idem_key, effect, rec.args, resolution="provider_lookup:absent")

    def decide(self, idem_key: str, *, performed: bool, result: dict[str, Any] | None = None,
               decided_by: str = "human") -> None:
        """A human's decision on a blocked effect: it happened (with result), or it may be performed."""
        rec = self.get(idem_key)
        if rec is None or rec.state not in ("blocked", "intent"):
            raise ValueError(f"no open effect with key {idem_key}")
        if performed:
            self._settle(rec.id, "committed", result or {}, f"{decided_by}:performed")
        else:
            self._settle(rec.id, "intent", None, "human:retry")
        self.conn.execute(
            "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"
            " updated_at = clock_timestamp() WHERE id = %s AND status = 'blocked'", (rec.task_id,),
        )
