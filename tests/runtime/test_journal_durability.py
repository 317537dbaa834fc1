"""The effect journal's crash consistency: what a real process asks of the kernel, and what a torn write reads as.

A power loss keeps only what was fsynced. The journal's promise -- an effect's intent is on disk before the call,
its outcome before the table -- is read here off the system calls of a real process writing journal entries
(strace), entry by entry, and its record format is shown to read a torn last append as absent, never as corrupt
and never as a different entry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from agent_runtime.effects.journal import EffectJournal, JournalEntry
from agent_runtime.errors import CorruptState
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore

from .conftest import ROOT

KEYS = ("eff-a", "eff-b", "eff-c")
# Writes journal entries as the ledger does (intent, then committed) for three effects, and says on stdout when
# each put returned: from that moment the ledger calls the provider, or commits the outcome in its table.
WRITER = """
import os, sys
from pathlib import Path
from agent_runtime.effects.journal import EffectJournal, JournalEntry
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
journal = EffectJournal(EncryptedObjectStore(FileObjectStore(Path(sys.argv[1])), bytes(32), "tenant-1"))
for key in sys.argv[2:]:
    for state in ("intent", "committed"):
        journal.put(JournalEntry(key, "task-1", "pay", "charge", {"amount": 1}, "d", state,
                                 {"id": "ch_1"} if state == "committed" else None, None, None, None))
        os.write(1, f"returned {key} {state}\\n".encode())
"""
_CALL = re.compile(r"^(?:\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")


def _entry(key: str, state: str, revision: int = 0) -> JournalEntry:
    return JournalEntry(key, "task-1", "pay", "charge", {"amount": 1}, "d", state,
                        {"id": "ch_1"} if state == "committed" else None, None, None, None, revision)


def _events(trace: str, root: Path) -> list[tuple[str, str]]:
    """(call, path) for each call on a file under `root` (fds resolved through their openat), plus each put's
    'returned' line on stdout."""
    fds: dict[str, str] = {}
    events: list[tuple[str, str]] = []
    for line in trace.splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        call, args, ret = m.groups()
        if call == "openat" and str(root) in args and int(ret) >= 0:
            fds[ret] = args.split('"')[1]
        elif call in ("write", "fsync", "fdatasync", "close"):
            fd = args.split(",")[0]
            if call == "write" and fd == "1":
                events.append(("returned", args.split('"')[1].removeprefix("returned ").removesuffix("\\n")))
            elif fd in fds:
                events.append((call, fds.pop(fd) if call == "close" else fds[fd]))
        elif call.startswith("rename") and str(root) in args:
            events.append(("rename", args.split('"')[3]))
    return [e for e in events if e[0] != "close"]


def test_every_journal_entry_is_on_disk_before_its_put_returns_with_one_flush_per_outcome(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    trace = tmp_path / "trace"
    out = subprocess.run(["strace", "-f", "-e", "trace=openat,write,close,fsync,fdatasync,rename,renameat,renameat2",
                          "-o", str(trace), sys.executable, "-c", WRITER, str(root), *KEYS],
                         check=True, timeout=120, cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.splitlines() == [f"returned {k} {s}" for k in KEYS for s in ("intent", "committed")]
    events = _events(trace.read_text(), root)
    ledger = str(root / "ledger")
    for key in KEYS:
        path = f"{ledger}/{key}"
        intent = events[:events.index(("returned", f"{key} intent"))]
        renamed = intent.index(("rename", path))
        tmp = intent[renamed - 1][1]
        assert tmp.startswith(f"{ledger}/.tmp-") and intent[renamed - 2:renamed] == [("write", tmp), ("fsync", tmp)]
        after = intent[renamed + 1:]
        # After the rename the directory holding the entry is fsynced (and, for the first entry, the root whose
        # new `ledger` directory it lives in) -- before the put returns, that is before the provider is called.
        assert ("fsync", ledger) in after, intent
        if key == KEYS[0]:
            assert ("fsync", str(root)) in after
        assert all(call in ("fsync",) for call, _ in after), after
        events = events[len(intent) + 1:]
        outcome = events[:events.index(("returned", f"{key} committed"))]
        # The outcome: appended in place and fdatasynced -- one flush, no new file, no rename, no directory fsync.
        assert outcome == [("write", path), ("fdatasync", path)], outcome
        events = events[len(outcome) + 1:]
    journal = EffectJournal(EncryptedObjectStore(FileObjectStore(root), bytes(32), "tenant-1"))
    assert [journal.get(k).state for k in KEYS] == ["committed"] * 3  # type: ignore[union-attr]


# The ledger's way for a new intent with a derived key (issue 39): created exclusively, beside the row's INSERT.
CREATOR = WRITER.replace("    for state in (\"intent\", \"committed\"):\n        journal.put(",
                         "    for state in (\"intent\", \"committed\"):\n        (journal.create if state == \"intent\""
                         " else journal.put)(")


def test_an_intent_created_exclusively_is_on_disk_before_create_returns(tmp_path: Path) -> None:
    assert CREATOR != WRITER
    root = tmp_path / "objects"
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-e", "trace=openat,write,close,fsync,fdatasync,link,linkat,unlink,unlinkat",
                    "-o", str(trace), sys.executable, "-c", CREATOR, str(root), *KEYS],
                   check=True, timeout=120, cwd=ROOT, capture_output=True, text=True)
    text = trace.read_text()
    ledger = str(root / "ledger")
    for key in KEYS:
        path = f"{ledger}/{key}"
        # The whole object is written and fsynced under a temporary name, hard-linked to its own (which fails,
        # replacing nothing, if the name exists), and the directory fsynced, all before create returns.
        intent = text[:text.index(f'write(1, "returned {key} intent')]
        link = intent.rindex(f'"{path}"')
        assert re.search(r"link(at)?\(", intent[intent.rindex("\n", 0, link):link]), intent[-2000:]
        tmp = re.findall(r'"(' + re.escape(ledger) + r'/\.tmp-[^"]+)"', intent)[-1]
        before = _events(intent[:link], root)
        assert before[-2:] == [("write", tmp), ("fsync", tmp)], before[-4:]
        assert ("fsync", ledger) in _events(intent[link:], root)
        text = text[len(intent):]
    journal = EffectJournal(EncryptedObjectStore(FileObjectStore(root), bytes(32), "tenant-1"))
    assert [journal.get(k).state for k in KEYS] == ["committed"] * 3  # type: ignore[union-attr]
    assert not [p for p in (root / "ledger").iterdir() if p.name.startswith(".tmp-")]


@pytest.fixture
def journal(tmp_path: Path) -> EffectJournal:
    return EffectJournal(EncryptedObjectStore(FileObjectStore(tmp_path), os.urandom(32), "tenant-1"))


def test_a_torn_outcome_append_reads_as_the_intent_it_follows(journal: EffectJournal, tmp_path: Path) -> None:
    """A power loss mid-append leaves the outcome cut short, the file grown with zeros where its bytes never
    reached the disk, or stale blocks in it. That append never returned, so the table never got the outcome: the
    journal answers the intent (in doubt: a lookup or a human), never an error that would stop the instance and
    never a guess."""
    path = tmp_path / "ledger" / "eff-1"
    journal.put(_entry("eff-1", "intent"))
    whole_intent = path.read_bytes()
    journal.put(_entry("eff-1", "committed", 1))
    full = path.read_bytes()
    assert journal.get("eff-1").state == "committed"  # type: ignore[union-attr]
    for torn in (full[:-1], full[:len(whole_intent) + 3], full[:len(whole_intent) + 10],
                 whole_intent + b"\x00" * (len(full) - len(whole_intent))):
        path.write_bytes(torn)
        assert journal.get("eff-1") == _entry("eff-1", "intent"), torn
    # The last record's length all there but some of its blocks stale: its CRC fails, and it is dropped.
    path.write_bytes(full[:-5] + bytes(5))
    assert journal.get("eff-1") == _entry("eff-1", "intent")


def test_the_append_after_a_torn_one_cuts_it_off_first(journal: EffectJournal, tmp_path: Path) -> None:
    """After the reboot the effect is settled and its next entry appended: the torn bytes must not end up between
    two records, where they would hide the new entry or make the object unreadable."""
    path = tmp_path / "ledger" / "eff-1"
    journal.put(_entry("eff-1", "intent"))
    whole_intent = path.read_bytes()
    journal.put(_entry("eff-1", "committed", 1))
    full = path.read_bytes()
    for torn in (full[:-1], full[:len(whole_intent) + 3], full[:-5] + bytes(5),
                 whole_intent + b"\x00" * (len(full) - len(whole_intent))):
        path.write_bytes(torn)
        journal.put(_entry("eff-1", "failed", 2))
        assert journal.get("eff-1") == _entry("eff-1", "failed", 2), torn
        assert [json.loads(r)["state"] for r in journal.store.records("ledger/eff-1")] == ["intent", "failed"]
        assert path.read_bytes().startswith(whole_intent)


def test_anything_but_a_torn_last_append_is_corruption(journal: EffectJournal, tmp_path: Path) -> None:
    path = tmp_path / "ledger" / "eff-1"
    journal.put(_entry("eff-1", "intent"))
    intent = path.read_bytes()
    journal.put(_entry("eff-1", "committed", 1))
    journal.put(_entry("eff-1", "committed", 2))
    full = path.read_bytes()
    # The first record was written whole (temp file, rename): cut short, it is not a torn append.
    for bad in (intent[:-1], intent[:6], intent[:4]):
        path.write_bytes(bad)
        with pytest.raises(CorruptState):
            journal.get("eff-1")
    # A middle record changed: not the last append, so not torn.
    middle = len(intent) + 30
    path.write_bytes(full[:middle] + bytes([full[middle] ^ 1]) + full[middle + 1:])
    with pytest.raises(CorruptState):
        journal.get("eff-1")
    # A record moved from another effect's object fails to open under this one's name.
    journal.put(_entry("eff-2", "intent"))
    path.write_bytes((tmp_path / "ledger" / "eff-2").read_bytes())
    with pytest.raises(CorruptState):
        journal.get("eff-1")


def test_an_entry_written_whole_by_an_older_journal_reads_and_takes_appends(journal: EffectJournal,
                                                                          tmp_path: Path) -> None:
    """Journals written before record objects hold one sealed JSON object per effect: it reads as the entry, and
    the first append replaces it (atomically, durably: a whole put) with a record object; later ones append."""
    old = _entry("eff-1", "intent")
    journal.store.put("ledger/eff-1", json.dumps(asdict(old), sort_keys=True).encode())
    assert journal.get("eff-1") == old
    journal.put(_entry("eff-1", "committed", 1))
    assert journal.get("eff-1") == _entry("eff-1", "committed", 1)
    assert (tmp_path / "ledger" / "eff-1").read_bytes().startswith(b"ARL1")
    journal.put(_entry("eff-1", "failed", 2))
    assert [json.loads(r)["state"] for r in journal.store.records("ledger/eff-1")] == ["committed", "failed"]
