"""The journal's exclusive create (issue 39): a new intent's object is written while its INSERT commits, so it
must never replace an object another writer made. Real files; the object is read back through the store."""

from __future__ import annotations

import os
from pathlib import Path

from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore


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
