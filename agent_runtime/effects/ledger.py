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
outcome for is looked up in the journal first -- on a step's replay, at boot and in `resolve` alike. An outcome
the journal holds settles the row without a human and is never overwritten with a weaker state.

A provider's "absent" is trusted only when the provider could have known: an adapter declares its lookup's
`lookup_consistency_s`, and inside that window since the last attempt (`attempted_at`) "absent" leaves the
effect in doubt, asked again later.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime.codec import canonical_json, sha256_hex
from agent_runtime.effects.base import EffectAdapter, ProviderRejected, ProviderUnreachable
from agent_runtime.effects.journal import INSERT_LOST, SETTLED, EffectJournal, JournalEntry
from agent_runtime.errors import (
    CorruptState,
    CredentialUnavailable,
    EffectFailed,
    EffectInDoubt,
    EffectKeyConflict,
    TaskBlocked,
)
from agent_runtime.state.rowchecks import effect_checksum
from agent_runtime.state.tasks import async_commit

__all__ = ["EffectLedger", "EffectRecord", "explicit_idempotency_key", "idempotency_key"]

log = logging.getLogger("agent_runtime.ledger")

# Resolutions of an intent that say the provider certainly has not acted (yet), so performing is the first
# delivery: a human checked and ordered it, or the last attempt never reached the provider (it could not connect,
# or its intent's INSERT raised before the call).
_SAFE_TO_PERFORM = ("human:retry", "unreached", INSERT_LOST)


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


def _entry(rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None, revision: int,
           attempted_at: float | None) -> JournalEntry:
    return JournalEntry(rec.idem_key, str(rec.task_id), rec.step, rec.effect, rec.args, rec.args_digest, state, result,
                        resolution, rec.ordinal, rec.explicit_key, revision, attempted_at)


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
        self._writer: ThreadPoolExecutor | None = None  # writes a new intent's journal object beside its INSERT

    def _journal(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None,
                 revision: int, attempted_at: float | None = None) -> None:
        if self.journal is not None:
            self.journal.put(_entry(rec, state, result, resolution, revision, attempted_at))

    def _insert_intent(self, fresh: EffectRecord) -> int | None:
        """Insert the new intent `fresh` and write it to the journal; its row id, or None when the key's row
        exists (another writer won, and the journal is theirs too).

        With a derived key the journal's object is created while the INSERT commits, on a thread of the ledger's
        own (both wait on I/O and release the GIL): both are durable before this returns, so before the call,
        which is all the order "journal before the call" asks. Created exclusively (`EffectJournal.create`), it
        never replaces an object another writer made; when one appeared since the journal was asked, the intent is
        appended after it, as in the serial order. A loser of the INSERT race may leave its intent as the object's
        first record: with a derived key that is the same logical call (task, step, effect, ordinal) the winner
        records next, which rule 3 already treats as one. An author's key can name calls of other tasks with
        other arguments, so there the order stays serial (the INSERT decides, then the journal).
        """
        attempted_at = time.time()  # also the row's, which names this attempt (`_insert_lost`)
        if self.journal is None or fresh.explicit_key is not None:
            try:
                new_id = self._insert(fresh, attempted_at)
            except BaseException:
                if self.journal is not None:
                    self._insert_lost(fresh, attempted_at, create=True)
                raise
            if new_id is not None:
                self._journal(fresh, "intent", None, None, fresh.revision, attempted_at)
            return new_id
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effect-journal")
        creating = self._writer.submit(self.journal.create,
                                       _entry(fresh, "intent", None, None, fresh.revision, attempted_at))
        try:
            new_id = self._insert(fresh, attempted_at)
        except BaseException:
            # Waited for even when the INSERT failed: no write outlives the call. The provider was not called and
            # will not be by this attempt; an intent it left in the journal must not read as in doubt.
            wait([creating])
            if not creating.exception() and creating.result():
                self._insert_lost(fresh, attempted_at)
            raise
        created = creating.result()
        if new_id is not None and not created:
            self._journal(fresh, "intent", None, None, fresh.revision, attempted_at)
        elif new_id is None and created:
            row = self.get(fresh.idem_key)
            if row is None:
                # No row won either: the INSERT refused an intent of a run a thread policy rolled back. Nobody can
                # write this key's row now, so the object just created is nobody's record: it goes, lest a restore
                # from before the rollback find an intent in doubt for a call that was never made.
                self.journal.discard(fresh.idem_key)
            elif row.state in SETTLED:
                # The table knew the key and the journal did not (a row from before the journal): the intent just
                # created must not be the journal's last word on an effect whose outcome the table holds.
                self._journal(row, row.state, row.result, row.resolution, row.revision)
        return new_id

    def _insert_lost(self, fresh: EffectRecord, attempted_at: float, *, create: bool = False) -> None:
        """The INSERT of `fresh`'s intent raised, so this attempt never called the provider: say so in the journal,
        so that a retry performs instead of asking a human (`EffectJournal.insert_lost`). `create`: the intent is
        not in the journal yet (the serial order) and is created first, unless another writer's object is there.

        Best effort: were these writes to fail too, the intent stays in doubt, as it was before this record existed;
        the INSERT's own error is the one raised.
        """
        assert self.journal is not None
        intent = _entry(fresh, "intent", None, None, fresh.revision, attempted_at)
        try:
            if create and not self.journal.create(intent):
                return
            self.journal.insert_lost(intent)
        except Exception as exc:
            log.warning("could not record that an effect's intent INSERT was lost; it stays in doubt",
                        extra={"event": "effect_insert_lost_unrecorded", "idem_key": fresh.idem_key,
                               "error": type(exc).__name__})
        else:
            log.warning("effect intent INSERT lost before the call; the retry will perform it",
                        extra={"event": "effect_insert_lost", "idem_key": fresh.idem_key})

    def _adopt(self, rec: EffectRecord | None, key: str, entry: JournalEntry | None = None) -> EffectRecord | None:
        """What the journal knows of `key` that the table does not: take it back.

        An outcome in the journal (committed, failed) settles an open row (intent, blocked) whatever the row's
        revision: the provider acted, or certainly did not, and no later bookkeeping changes that. An open state
        is taken back only when it is newer than the row (the table was rewound).
        """
        if self.journal is None or (rec is not None and rec.state in SETTLED):
            return rec
        entry = entry or self.journal.get(key)
        if entry is None:
            return rec
        if rec is not None and entry.state not in SETTLED and entry.revision <= rec.revision:
            return rec
        if rec is not None and entry.resolution == INSERT_LOST and not self._row_of_attempt(rec, entry.attempted_at):
            return rec  # the row is an earlier attempt's (from before the journal), which may have called
        resolution = f"journal:{entry.resolution}" if entry.state in SETTLED else entry.resolution
        if rec is None:
            fresh = EffectRecord(0, UUID(entry.task_id), entry.step, entry.effect, key, entry.args,
                                 entry.args_digest, entry.state, entry.result, resolution, entry.ordinal,
                                 entry.explicit_key, max(1, entry.revision))
            self._insert(fresh, attempted_at=entry.attempted_at)
        else:
            self._write(rec, entry.state, entry.result, resolution, revision=max(entry.revision, rec.revision + 1))
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

    def _settle(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None, *,
                attempted: bool = False) -> EffectRecord | None:
        """Record `state` in the journal (the outcome outlives any rewind), then in the table; return None.

        An open state (intent, blocked) is never written over an outcome the journal already holds: that
        outcome is taken into the table instead and returned, for the caller to answer from.
        """
        if self.journal is not None and state not in SETTLED:
            known = self.journal.get(rec.idem_key)
            if known is not None and known.state in SETTLED:
                return self._adopt(rec, rec.idem_key, known)
        self._journal(rec, state, result, resolution, rec.revision + 1, time.time() if attempted else None)
        # An outcome the journal holds (durable before this write) need not wait for the WAL flush in the table:
        # were a PostgreSQL or OS crash to lose the row's outcome, the row reads 'intent' again and the journal
        # settles it (replay, boot, resolve) without a call or a human. Without a journal the table is the only
        # record, and waits.
        self._write(rec, state, result, resolution, attempted=attempted,
                    durable_elsewhere=self.journal is not None and state in SETTLED)
        return None

    def _write(self, rec: EffectRecord, state: str, result: dict[str, Any] | None, resolution: str | None,
               revision: int | None = None, *, attempted: bool = False, durable_elsewhere: bool = False) -> None:
        """The one way an effect row changes: new state, result and resolution, their checksum, a new revision
        (and, when the effect is about to be attempted again, the attempt's time). `durable_elsewhere`: the
        journal holds this state already, so the commit need not wait for the WAL flush (`async_commit`)."""
        self.conn.execute(
            "UPDATE effects SET state = %s, result = %s, resolution = %s, checksum = %s, revision = %s,"  # noqa: S608
            " settled_at = CASE WHEN %s IN ('committed', 'failed') THEN clock_timestamp() END,"
            " attempted_at = CASE WHEN %s THEN clock_timestamp() ELSE attempted_at END WHERE id = %s"
            + (f" RETURNING {async_commit(self.conn)}" if durable_elsewhere else ""),
            (state, Jsonb(result) if result is not None else None, resolution,
             rec.checksum_for(state, result, resolution), revision if revision is not None else rec.revision + 1,
             state, attempted, rec.id),
        )

    def _insert(self, rec: EffectRecord, attempted_at: float | None = None) -> int | None:
        """Insert `rec` (its id is ignored); None when its key exists already (another writer won).

        `attempted_at` (epoch seconds): the attempt's time, a new intent's as its journal record says (which names
        the attempt) or the time the journal recorded for a row it gives back; None for the database's now.
        """
        # A new intent of a run a thread policy rolled back is not written (`state.threads`): the task row is
        # read under KEY SHARE, so an intent and a rollback's check of the run's effects happen one after the
        # other, never both past each other.
        row = self.conn.execute(
            "INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, result, resolution,"
            " ordinal, explicit_key, checksum, revision, settled_at, attempted_at) SELECT %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, %s, %s, %s, %s, CASE WHEN %s IN ('committed', 'failed') THEN clock_timestamp() END,"
            " coalesce(to_timestamp(%s::float8), clock_timestamp())"
            " WHERE %s <> 'intent' OR coalesce((SELECT status FROM tasks WHERE id = %s FOR KEY SHARE), '')"
            " <> 'rolled_back'"
            " ON CONFLICT (idem_key) DO NOTHING RETURNING id",
            (rec.task_id, rec.step, rec.effect, rec.idem_key, Jsonb(rec.args), rec.args_digest, rec.state,
             Jsonb(rec.result) if rec.result is not None else None, rec.resolution, rec.ordinal, rec.explicit_key,
             rec.checksum_for(rec.state, rec.result, rec.resolution), rec.revision, rec.state, attempted_at,
             rec.state, rec.task_id),
        ).fetchone()
        return int(row[0]) if row else None

    def _rolled_back(self, task_id: UUID) -> bool:
        row = self.conn.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()
        return row is not None and row[0] == "rolled_back"

    def _row_of_attempt(self, rec: EffectRecord, attempted_at: float | None) -> bool:
        """Whether `rec`'s row was written by the attempt made at `attempted_at` (which a fresh intent's INSERT
        stores exactly), not by an earlier one."""
        row = self.conn.execute("SELECT attempted_at = to_timestamp(%s::float8) FROM effects WHERE id = %s",
                                (attempted_at, rec.id)).fetchone()
        return bool(row and row[0])

    def _seconds_since_attempt(self, rec: EffectRecord) -> float:
        """Seconds since the effect's last attempt, the lesser of the database's and this host's reading: a first
        attempt's time is the host's (`_insert_intent`), a repeat's the database's, and a clock running ahead of
        the other must never make a lagging lookup's "absent" trusted early."""
        row = self.conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - attempted_at), extract(epoch FROM attempted_at)"
            " FROM effects WHERE id = %s", (rec.id,)
        ).fetchone()
        if not row or row[0] is None:
            return 0.0
        return min(float(row[0]), time.time() - float(row[1]))

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
        return self.run_reporting(task_id, step, effect, adapter, args, ordinal=ordinal, explicit_key=explicit_key)[0]

    def run_reporting(self, task_id: UUID, step: str, effect: str, adapter: EffectAdapter, args: dict[str, Any], *,
                      ordinal: int = 0, explicit_key: str | None = None) -> tuple[dict[str, Any], bool]:
        """`run`, also saying whether the table held the effect committed already (a replay): the caller's span
        tells performed from replayed without reading the row a second time."""
        key = self.key_for(task_id, step, effect, ordinal=ordinal, explicit_key=explicit_key)
        digest = args_digest(args)
        # The first call of a key is the common case: the journal (no round trip when local) then one INSERT
        # that is also the lookup; a key the table or the journal already knows goes the replay way.
        entry = self.journal.get(key) if self.journal is not None else None
        rec: EffectRecord | None = None
        if entry is None:
            fresh = EffectRecord(0, task_id, step, effect, key, args, digest, "intent", None, None, ordinal,
                                 explicit_key)
            new_id = self._insert_intent(fresh)  # in the table and the journal before the call can land
            if new_id is not None:
                return self._perform(replace(fresh, id=new_id), adapter, resolution="performed"), False
            rec = self.get(key)
            replayed = rec is not None and rec.state == "committed"
        else:
            before = self.get(key)
            replayed = before is not None and before.state == "committed"
            rec = self._adopt(before, key, entry)
        if rec is None and self._rolled_back(task_id):
            raise TaskBlocked("rolled_back", f"effect {effect!r} not performed: a new message rolled this run back")
        if rec is None:  # the row vanished between the INSERT and the read: start over
            return self.run_reporting(task_id, step, effect, adapter, args, ordinal=ordinal,
                                      explicit_key=explicit_key)
        if rec.args_digest != digest:
            if explicit_key is not None:
                raise EffectKeyConflict(
                    f"effect {effect!r} was already called with key {explicit_key!r} and different arguments "
                    f"(by task {rec.task_id}, step {rec.step!r}); an explicit key names one call: use a new key "
                    "for a different call")
            log.warning("effect replay with different arguments ignored; recorded result returned",
                        extra={"event": "effect_args_mismatch", "effect": effect, "idem_key": key,
                               "task_id": str(task_id), "step": step})
        return self._continue(rec, adapter), replayed

    def _continue(self, rec: EffectRecord, adapter: EffectAdapter) -> dict[str, Any]:
        """Answer for a key the ledger already knows (after the journal was consulted)."""
        if rec.state == "committed":
            assert rec.result is not None
            return rec.result
        if rec.state == "failed":
            raise EffectFailed(f"effect {rec.effect} of step {rec.step} was refused earlier: {rec.result}")
        if rec.state == "blocked":
            raise TaskBlocked("effect_in_doubt", f"{rec.effect} ({rec.idem_key}) awaits a human decision")
        if rec.resolution in _SAFE_TO_PERFORM:
            return self._perform_recorded(rec, adapter, resolution=f"{rec.resolution}:performed")
        return self._ask(rec, adapter)

    def _perform_recorded(self, rec: EffectRecord, adapter: EffectAdapter, resolution: str) -> dict[str, Any]:
        """Perform with the arguments the intent recorded, after checking they are the ones recorded."""
        if args_digest(rec.args) != rec.args_digest:
            raise CorruptState(f"effect {rec.effect} ({rec.idem_key}): recorded arguments do not match their "
                               "digest (edited or corrupted row); refusing to perform them")
        # From here the call may land: a crash now must leave the intent in doubt (not "safe to perform"), and a
        # lagging lookup's window starts again from this attempt.
        settled = self._settle(rec, "intent", None, None, attempted=True)
        if settled is not None:
            return self._continue(settled, adapter)
        return self._perform(replace(rec, resolution=None, revision=rec.revision + 1), adapter, resolution)

    def _perform(self, rec: EffectRecord, adapter: EffectAdapter, resolution: str) -> dict[str, Any]:
        try:
            result = adapter.perform(rec.idem_key, rec.args)
        except ProviderRejected as exc:
            self._settle(rec, "failed", {"error": str(exc)}, resolution)
            raise EffectFailed(f"provider refused {rec.effect}: {exc}") from exc
        except ProviderUnreachable as exc:
            settled = self._settle(rec, "intent", None, "unreached")
            if settled is not None:
                return self._continue(settled, adapter)
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}): provider unreachable, will try again: {exc}") from exc
        except CredentialUnavailable:
            # Adapters read their credentials before sending anything (the built-in ones do, and the adapter
            # contract asks it): the call was not made, so the intent is safe to perform once the credential is
            # there. The task blocks on the credential (the runner), not in doubt and not retried blind.
            settled = self._settle(rec, "intent", None, "unreached")
            if settled is not None:
                return self._continue(settled, adapter)
            raise
        except Exception as exc:
            # Outcome unknown (timeout, reset, 5xx): the intent stays in doubt; never blindly retried.
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}) outcome unknown: {type(exc).__name__}: {exc}"
                                ) from exc
        self._settle(rec, "committed", result, resolution)
        return result

    def resolve(self, rec: EffectRecord, adapter: EffectAdapter) -> dict[str, Any]:
        """Settle an open effect: from the journal when it holds the outcome; else ask the provider by key
        (trusting "absent" only once the provider could know), repeat it where the key makes that safe, or
        block it for a human."""
        return self._continue(self._adopt(rec, rec.idem_key) or rec, adapter)

    def settle_from_journal(self, rec: EffectRecord) -> EffectRecord:
        """A blocked effect whose outcome the journal holds (it reached the journal, not the table, before a
        kill) is settled from it and its task re-queued, in one transaction: no human is asked what is known."""
        with self.conn.transaction():
            adopted = self._adopt(rec, rec.idem_key)
            if adopted is None or adopted.state not in SETTLED:
                return rec
            self.conn.execute(
                "UPDATE tasks SET status = 'pending', blocked_reason = NULL, blocked_detail = NULL,"
                " updated_at = clock_timestamp() WHERE id = %s AND status = 'blocked'"
                " AND blocked_reason = 'effect_in_doubt'", (rec.task_id,))
        return adopted

    def _ask(self, rec: EffectRecord, adapter: EffectAdapter) -> dict[str, Any]:
        """The provider is the only one left who can tell: lookup, key-safe repeat, or a human."""
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
                window = float(getattr(adapter, "lookup_consistency_s", 0.0) or 0.0)
                since = self._seconds_since_attempt(rec) if window > 0 else window
                if since >= window:
                    # The provider could have known and never received it: this is the first and only delivery.
                    return self._perform_recorded(rec, adapter, resolution="provider_lookup:absent")
                if getattr(adapter, "replay_safe", False):
                    return self._perform_recorded(rec, adapter, resolution="provider_replay")
                raise EffectInDoubt(
                    f"{rec.effect} ({rec.idem_key}): the provider's lookup says absent, but it may lag up to "
                    f"{window:g}s after an attempt and the last one was {since:.1f}s ago; asked again later")
            raise EffectInDoubt(f"{rec.effect} ({rec.idem_key}): provider could not say: {answer.detail}")
        if getattr(adapter, "replay_safe", False):
            return self._perform_recorded(rec, adapter, resolution="provider_replay")
        settled = self._settle(rec, "blocked", None, "no_provider_lookup")
        if settled is not None:
            return self._continue(settled, adapter)
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
            # What the journal knows is not a human's to overrule: a known outcome settles the effect instead.
            settled = self._adopt(rec, idem_key)
            if settled is not None and settled.state in SETTLED:
                pass
            elif performed:
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
