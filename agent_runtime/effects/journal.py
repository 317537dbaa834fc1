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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from agent_runtime.errors import SnapshotMissing
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["SETTLED", "EffectJournal", "JournalEntry"]

# States that are outcomes: the provider acted (committed) or certainly did not and never will (failed).
SETTLED = ("committed", "failed")


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

    def get(self, idem_key: str) -> JournalEntry | None:
        try:
            records = self.store.records(self.object_key(idem_key))
        except SnapshotMissing:
            return None
        # The last record is the last write, as a whole object's put replaced the one before.
        return JournalEntry(**json.loads(records[-1]))

