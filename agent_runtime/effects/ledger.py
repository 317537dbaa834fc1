"""Effect ledger for irreversible calls (email, payment, webhook): every effect is a committed fact.

Before the call an intent is committed under an idempotency key derived from the logical step — (task,
step, effect name, the effect's ordinal among that step's calls of the same effect) — or from a key the
author chose; never from the arguments. After the call the result is committed. On replay a committed
effect returns its recorded result without calling, whatever arguments the replay produced (a derived key)
or is refused when an author's explicit key comes back with different arguments (`EffectKeyConflict`).

An intent without outcome is *in doubt*; `effects.base` says how it is resolved (lookup, a key-safe repeat,
or a human). Arguments recorded with an intent are verified against their digest before they are performed.

With a journal (`effects.journal`, in the object store) the ledger outlives restores of the schema: the
intent reaches the journal before the call, the outcome before the table, and a key the table knows no
outcome for is looked up in the journal first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.codec import canonical_json, sha256_hex
from agent_runtime.effects.base import EffectAdapter, ProviderRejected, ProviderUnreachable
from agent_runtime.effects.journal import EffectJournal, JournalEntry
from agent_runtime.errors import CorruptState, EffectFailed, EffectInDoubt, EffectKeyConflict, TaskBlocked
from agent_runtime.state.rowchecks import effect_checksum

__all__ = ["EffectLedger", "EffectRecord", "explicit_idempotency_key", "idempotency_key"]

log = logging.getLogger("agent_runtime.ledger")

# Resolutions of an intent that say the provider certainly has not acted (yet), so performing is the first
# delivery: a human checked and ordered it, or the last attempt never reached the provider.
_SAFE_TO_PERFORM = ("human:retry", "unreached")


@dataclass(frozen=True)
class EffectRecord:
    id: int
    task_id: UUID
    step: str
    effect: str
    idem_key: str
    args: dict[str, Any]
    args_digest: str
    state: str
    result: dict[str, Any] | None
    resolution: str | None
    ordinal: int | None
    explicit_key: str | None
    revision: int = 1  # see JournalEntry.revision

    def checksum_for(self, state: str, result: dict[str, Any] | None, resolution: str | None) -> str:
        return effect_checksum(self.idem_key, self.task_id, self.step, self.effect, self.args_digest, state, result,
                               resolution, self.ordinal, self.explicit_key)


def idempotency_key(task_id: UUID | str, step: str, effect: str, ordinal: int = 0) -> str:
    """Derived from the logical step only: regenerated arguments cannot produce a new key.

    The first call of an effect in a step keeps the key earlier runtimes derived (no ordinal), so a task that
    was in flight across an upgrade replays instead of performing again.
    """
    base = f"{task_id}\x00{step}\x00{effect}"
    return "eff-" + sha256_hex(base if ordinal == 0 else f"{base}\x00{ordinal}")[:40]


def explicit_idempotency_key(tenant_id: str, effect: str, key: str) -> str:
    """An author's key is scoped to the tenant and the effect (not the task): 'invoice-42' is paid once, ever.

    The tenant id is part of it so two tenants sharing one provider account never collide at the provider.
    """
    return "eff-x-" + sha256_hex(f"{tenant_id}\x00{effect}\x00{key}")[:40]


def args_digest(args: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(args))


_COLS = ("id, task_id, step, effect, idem_key, args, args_digest, state, result, resolution, ordinal, explicit_key,"
         " checksum, revision")


def _rec(row: tuple[Any, ...]) -> EffectRecord:
    rec = EffectRecord(int(row[0]), row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9],
                       row[10], row[11], int(row[13]))
    if row[12] != rec.checksum_for(rec.state, rec.result, rec.resolution):
        raise CorruptState(f"effect {rec.effect} ({rec.idem_key}) failed its checksum (edited or corrupted row); "
                           "nothing is replayed or performed from it")
    return rec


class EffectLedger:
    """Ledger access on an autocommit connection: intent and outcome are separate committed facts."""

    def __init__(self, conn: psycopg.Connection, tenant_id: str = "", journal: EffectJournal | None = None) -> None:
        if not conn.autocommit:
            raise ValueError("EffectLedger needs an autocommit connection: intents must commit before the call")
        self.conn = conn
        self.tenant_id = tenant_id
        self.journal = journal

    def _journal(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None,
                 revision: int) -> None:
        if self.journal is not None:
            self.journal.put(JournalEntry(rec.idem_key, str(rec.task_id), rec.step, rec.effect, rec.args,
                                          rec.args_digest, state, result, resolution, rec.ordinal, rec.explicit_key,
                                          revision))

    def _adopt(self, rec: EffectRecord | None, key: str, entry: JournalEntry | None = None) -> EffectRecord | None:
        """What the journal knows of `key` that the table does not (the table was rewound): take it back."""
        if self.journal is None or (rec is not None and rec.state != "intent"):
            return rec
        entry = entry or self.journal.get(key)
        if entry is None or (rec is not None and entry.revision <= rec.revision):
            return rec
        resolution = f"journal:{entry.resolution}" if entry.state != "intent" else entry.resolution
        if rec is None:
            fresh = EffectRecord(0, UUID(entry.task_id), entry.step, entry.effect, key, entry.args,
                                 entry.args_digest, entry.state, entry.result, resolution, entry.ordinal,
                                 entry.explicit_key, max(1, entry.revision))
            self._insert(fresh)
        else:
            self._write(rec, entry.state, entry.result, resolution, revision=entry.revision)
        log.warning("effect taken back from the journal (the ledger table had been rewound)",
                    extra={"event": "effect_from_journal", "idem_key": key, "state": entry.state})
        return self.get(key)

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

    def for_task(self, task_id: UUID) -> list[EffectRecord]:
        rows = self.conn.execute(
            f"SELECT {_COLS} FROM effects WHERE task_id = %s ORDER BY id", (task_id,)  # noqa: S608
        ).fetchall()
        return [_rec(r) for r in rows]

    def count(self, task_id: UUID, state: str = "committed") -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM effects WHERE task_id = %s AND state = %s", (task_id, state)
        ).fetchone()
        return int(row[0]) if row else 0

    def _settle(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None) -> None:
        self._journal(rec, state, result, resolution, rec.revision + 1)  # the outcome outlives any rewind
        self._write(rec, state, result, resolution)

    def _write(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None,
               revision: int | None = None) -> None:
        """The one way an effect row changes: new state, result and resolution, their checksum, a new revision."""
        self.conn.execute(
            "UPDATE effects SET state = %s, result = %s, resolution = %s, checksum = %s, revision = %s,"
            " settled_at = CASE WHEN %s IN ('committed', 'failed') THEN clock_timestamp() END WHERE id = %s",
            (state, Jsonb(result) if result is not None else None, resolution,
             rec.checksum_for(state, result, resolution), revision if revision is not None else rec.revision + 1,
             state, rec.id),
        )

    def _insert(self, rec: EffectRecord) -> int | None:
        """Insert `rec` (its id is ignored); None when its key exists already (another writer won)."""
        row = self.conn.execute(
            "INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, result, resolution,"
            " ordinal, explicit_key, checksum, revision, settled_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, CASE WHEN %s IN ('committed', 'failed') THEN clock_timestamp() END)"
            " ON CONFLICT (idem_key) DO NOTHING RETURNING id",
            (rec.task_id, rec.step, rec.effect, rec.idem_key, Jsonb(rec.args), rec.args_digest, rec.state,
             Jsonb(rec.result) if rec.result is not None else None, rec.resolution, rec.ordinal, rec.explicit_key,
             rec.checksum_for(rec.state, rec.result, rec.resolution), rec.revision, rec.state),
        ).fetchone()
        return int(row[0]) if row else None

    def key_for(self, task_id: UUID, step: str, effect: str, *, ordinal: int = 0,
                explicit_key: str | None = None) -> str:
        if explicit_key is not None:
            if not explicit_key or len(explicit_key) > 255:
                raise ValueError("an explicit effect key must be 1 to 255 characters")
            return explicit_idempotency_key(self.tenant_id, effect, explicit_key)
        return idempotency_key(task_id, step, effect, ordinal)

    def run(self, task_id: UUID, step: str, effect: str, adapter: EffectAdapter, args: dict[str, Any], *,
            ordinal: int = 0, explicit_key: str | None = None) -> dict[str, Any]:
        """Perform `effect` at most once for its key; return its recorded result."""
        key = self.key_for(task_id, step, effect, ordinal=ordinal, explicit_key=explicit_key)
        digest = args_digest(args)
        # The first call of a key is the common case: the journal (no round trip when local) then one INSERT
        # that is also the lookup; a key the table or the journal already knows goes the replay way.
        entry = self.journal.get(key) if self.journal is not None else None
        rec: EffectRecord | None = None
        if entry is None:
            fresh = EffectRecord(0, task_id, step, effect, key, args, digest, "intent", None, None, ordinal,
                                 explicit_key)
            new_id = self._insert(fresh)
            if new_id is not None:
                rec = replace(fresh, id=new_id)
                self._journal(rec, "intent", None, None, rec.revision)  # in the journal before the call can land
                return self._perform(rec, adapter, resolution="performed")
            rec = self.get(key)
        else:
            rec = self._adopt(self.get(key), key, entry)
        if rec is None:  # the row vanished between the INSERT and the read: start over
            return self.run(task_id, step, effect, adapter, args, ordinal=ordinal, explicit_key=explicit_key)
        if rec.args_digest != digest:
            if explicit_key is not None:
                raise EffectKeyConflict(
                    f"effect {effect!r} was already called with key {explicit_key!r} and different arguments "
                    f"(by task {rec.task_id}, step {rec.step!r}); an explicit key names one call: use a new key "
                    "for a different call")
            log.warning("effect replay with different arguments ignored; recorded result returned",
                        extra={"event": "effect_args_mismatch", "effect": effect, "idem_key": key,
                               "task_id": str(task_id), "step": step})
        if rec.state == "committed":
            assert rec.result is not None
            return rec.result
        if rec.state == "failed":
            raise EffectFailed(f"effect {effect} of step {step} was refused earlier: {rec.result}")
        if rec.state == "blocked":
            raise TaskBlocked("effect_in_doubt", f"{effect} ({key}) awaits a human decision")
        if rec.resolution in _SAFE_TO_PERFORM:
            return self._perform_recorded(rec, adapter, resolution=f"{rec.resolution}:performed")
        return self.resolve(rec, adapter)

    def _perform_recorded(self, rec: EffectRecord, adapter: EffectAdapter, resolution: str) -> dict[str, Any]:
        """Perform with the arguments the intent recorded, after checking they are the ones recorded."""
        if args_digest(rec.args) != rec.args_digest:
            raise CorruptState(f"effect {rec.effect} ({rec.idem_key}): recorded arguments do not match their "
                               "digest (edited or corrupted row); refusing to perform them")
        if rec.resolution is not None:
            # From here the call may land: a crash now must leave the intent in doubt, not "safe to perform".
            self._write(rec, rec.state, rec.result, None)
            rec = replace(rec, resolution=None)
        return self._perform(rec, adapter, resolution)

    def _perform(self, rec: EffectRecord, adapter: EffectAdapter, resolution: str) -> dict[str, Any]:
        try:
            result = adapter.perform(rec.idem_key, rec.args)
        except ProviderRejected as exc:
            self._settle(rec, "failed", {"error": str(exc)}, resolution)
            raise EffectFailed(f"provider refused {rec.effect}: {exc}") from exc
        except ProviderUnreachable as exc:
            self._settle(rec, "intent", None, "unreached")
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}): provider unreachable, will try again: {exc}") from exc
        except Exception as exc:
            # Outcome unknown (timeout, reset, 5xx): the intent stays in doubt; never blindly retried.
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}) outcome unknown: {type(exc).__name__}: {exc}"
                                ) from exc
        self._settle(rec, "committed", result, resolution)
        return result

    def resolve(self, rec: EffectRecord, adapter: EffectAdapter) -> dict[str, Any]:
        """Resolve an in-doubt intent: ask the provider by key, repeat it where the key makes that safe, or
        block it for a human."""
        if getattr(adapter, "supports_lookup", False):
            try:
                answer = adapter.lookup(rec.idem_key)
            except Exception as exc:  # provider down or 5xx during the lookup: still in doubt, ask again later
                raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}): lookup failed: {type(exc).__name__}: {exc}"
                                    ) from exc
            if answer.outcome == "found":
                self._settle(rec, "committed", answer.result or {}, "provider_lookup:found")
                return answer.result or {}
            if answer.outcome == "absent":
                # The provider never received it: performing now is the first and only delivery.
                return self._perform_recorded(rec, adapter, resolution="provider_lookup:absent")
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}): provider could not say: {answer.detail}")
        if getattr(adapter, "replay_safe", False):
            return self._perform_recorded(rec, adapter, resolution="provider_replay")
        self._settle(rec, "blocked", None, "no_provider_lookup")
        raise TaskBlocked("effect_in_doubt", f"{rec.effect} ({rec.idem_key}): the provider cannot be asked whether "
                                             "it acted; a human must decide")

    def decide(self, idem_key: str, *, performed: bool, result: dict[str, Any] | None = None,
               decided_by: str = "human", perform: bool = True) -> EffectRecord:
        """A human's decision on an open effect: it happened (with result); it did not and may be performed now
        (`perform`); or it did not and must not be (`perform=False`: settled failed, the task is blocked).

        The decision, the effect's new state and the task's re-queueing are one transaction.
        """
        rec = self.get(idem_key)
        if rec is None or rec.state not in ("blocked", "intent"):
            raise ValueError(f"no open effect with key {idem_key}")
        who = decided_by.replace(":", " ")[:100] or "human"
        with self.conn.transaction():
            if performed:
                self._settle(rec, "committed", result or {}, f"{who}:performed")
            elif perform:
                self._settle(rec, "intent", None, "human:retry")
            else:
                self._settle(rec, "failed", {"decided_by": who, "reason": "not performed"}, f"{who}:not_performed")
            self.conn.execute(
                "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"
                " updated_at = clock_timestamp() WHERE id = %s AND status = 'blocked'", (rec.task_id,),
            )
        got = self.get(idem_key)
        assert got is not None
        return got
