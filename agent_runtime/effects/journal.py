"""The effect journal: every intent and outcome, also kept in the tenant's object store.

A committed effect is a fact of the world, not of the schema. The `effects` table is rewound by whatever
rewinds the schema — a restore from an archive or a backup, a point-in-time recovery — while the effect
stays done at the provider. So the ledger writes each intent to the journal *before* the call and each
outcome *before* recording it in the table, and asks the journal whenever the table has no outcome for a
key: a replay after a restore finds the effect committed and returns its recorded answer, or finds it in
doubt and settles it as any in-doubt effect (lookup, key-safe repeat, or a human).

The journal is evidence, never overruled by something weaker: an outcome it holds (committed or failed)
settles an intent or a blocked row of the table without a human, and the ledger never writes a weaker state
over such an outcome.

Objects are `ledger/<idempotency key>`, one per effect: a record object (`agent_runtime.state.records`) with one
JSON record per change, the last one current, each encrypted like every object of the tenant. The intent creates
the object (a whole, fsynced, renamed object whose directory is fsynced); the outcome is appended to it, durable
with one `fdatasync` and no rename (on S3, which cannot append, each write is one PUT of the object whole).
Checkpoint rollbacks, workspace restores and forks never touch it. No SQL here.

An attempt whose intent INSERT raised (a connection lost mid-statement) never called the provider, which is called
only after that INSERT returns; but its intent may already be in the journal, created beside the INSERT. That
attempt leaves a second object, `ledger-unreached/<idempotency key>`, naming itself by its intent's
`attempted_at`. While the effect's last record is still that bare intent, nobody has written since (a racer's
intent or outcome, on S3 too, where a write replaces the object), and `get` answers it as unreached: safe to
perform, not a question for a human. The ledger also checks that the table's row, if any, is that attempt's own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from agent_runtime.errors import SnapshotMissing
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["INSERT_LOST", "SETTLED", "EffectJournal", "JournalEntry"]

# States that are outcomes: the provider acted (committed) or certainly did not and never will (failed).
SETTLED = ("committed", "failed")

# The resolution `get` answers for a bare intent whose attempt lost its INSERT (see the module's docstring).
INSERT_LOST = "unreached:insert_lost"


@dataclass(frozen=True)
class JournalEntry:
    idem_key: str
    task_id: str
    step: str
    effect: str
    args: dict[str, Any]
    args_digest: str
    state: str  # intent | committed | failed | blocked
    result: dict[str, Any] | None
    resolution: str | None
    ordinal: int | None
    explicit_key: str | None
    # Bumped on every change of the row, in the table and here alike: whichever is newer wins, so a rewound
    # table takes the journal back, and a change made without the journal (an operator's decision through a
    # plain ledger) is not undone by an older journal entry.
    revision: int = 0
    # When the intent was last attempted (epoch seconds, the host's clock): after a restore lost the row, a
    # lagging provider lookup is still distrusted for its window from the true attempt, not from the restore.
    attempted_at: float | None = None


class EffectJournal:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def object_key(idem_key: str) -> str:
        return f"ledger/{idem_key}"

    def put(self, entry: JournalEntry) -> None:
        """Durable once it returns: the entry becomes the effect's current one."""
        self.store.append(self.object_key(entry.idem_key), json.dumps(asdict(entry), sort_keys=True).encode())

    def create(self, entry: JournalEntry) -> bool:
        """`put` for a key the journal does not hold yet: False, writing nothing, when it holds it (another
        writer's entries are never replaced or followed by this one)."""
        return self.store.create(self.object_key(entry.idem_key), json.dumps(asdict(entry), sort_keys=True).encode())

    def discard(self, idem_key: str) -> None:
        """Remove the object of a key nobody recorded (an intent created beside an INSERT the table refused)."""
        self.store.delete(self.object_key(idem_key))

    def insert_lost(self, entry: JournalEntry) -> None:
        """Say that the attempt whose intent is `entry` lost its INSERT, so never called the provider."""
        self.store.put(f"ledger-unreached/{entry.idem_key}",
                       json.dumps({"attempted_at": entry.attempted_at}).encode())

    def get(self, idem_key: str) -> JournalEntry | None:
        try:
            records = self.store.records(self.object_key(idem_key))
        except SnapshotMissing:
            return None
        # The last record is the last write, as a whole object's put replaced the one before.
        last = JournalEntry(**json.loads(records[-1]))
        if last.state != "intent" or last.resolution is not None or last.attempted_at is None:
            return last
        try:  # a bare intent, the rare case (an effect in doubt): did its attempt lose its INSERT?
            lost = json.loads(self.store.get(f"ledger-unreached/{idem_key}"))
        except SnapshotMissing:
            return last
        if lost.get("attempted_at") != last.attempted_at:
            return last
        return replace(last, resolution=INSERT_LOST, revision=last.revision + 1)

