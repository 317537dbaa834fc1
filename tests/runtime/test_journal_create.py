"""The journal's exclusive create (issue 39): a new intent's object is written while its INSERT commits, so it
must never replace an object another writer made, nor leave a bare intent over an outcome the table holds. Real
files and a real tenant schema; objects are read back through the store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from agent_runtime.effects.base import LookupResult
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import EffectLedger
from agent_runtime.state import tasks
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore


class Charge:
    supports_lookup = False
    replay_safe = True

    def __init__(self) -> None:
        self.calls = 0

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"id": idem_key[-8:], "amount": args["amount"]}

    def lookup(self, idem_key: str) -> LookupResult:
        return LookupResult.unknown("keeps no record")


def test_create_writes_a_new_object_once_and_never_replaces_one(tmp_path: Path) -> None:
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), "tenant")
    assert store.create("ledger/eff-1", b"first") is True
    assert store.create("ledger/eff-1", b"second") is False
    assert store.records("ledger/eff-1") == [b"first"]
    store.append("ledger/eff-1", b"outcome")
    assert store.create("ledger/eff-1", b"late intent") is False
    assert store.records("ledger/eff-1") == [b"first", b"outcome"]
    # No temporary file is left behind either way.
    assert sorted(p.name for p in (tmp_path / "objects" / "ledger").iterdir()) == ["eff-1"]


def test_a_key_the_table_knew_without_the_journal_ends_with_the_tables_outcome(conn: psycopg.Connection,
                                                                              tmp_path: Path) -> None:
    """A row from before the journal: the replay's exclusive create finds no object and makes one beside an INSERT
    that loses to the row; the journal's last record is then the row's outcome, never a bare intent."""
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), "tenant")
    task_id = tasks.submit(conn, "k", {})
    first = EffectLedger(conn, "tenant").run(task_id, "pay", "charge", Charge(), {"amount": 5})
    journaled = EffectLedger(conn, "tenant", EffectJournal(store))
    charge = Charge()
    assert journaled.run(task_id, "pay", "charge", charge, {"amount": 5}) == first
    assert charge.calls == 0
    entry = EffectJournal(store).get(journaled.key_for(task_id, "pay", "charge"))
    assert entry is not None and entry.state == "committed" and entry.result == first
