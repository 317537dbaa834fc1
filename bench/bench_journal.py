"""Benchmark: the effect journal's cost per effect (intent, then outcome) on the file object store, issue 39.

Ours: `EffectJournal` as the ledger drives it for a new effect: a look-up that misses, the intent (a whole object:
temp file, fsync, rename, directory fsync), the outcome appended to it (one `fdatasync`). Anchor, same store, same
run: the layout it replaced, two whole objects per effect (the same look-up, then two durable puts, each with its
fsyncs). Both through the tenant's encryption, in alternating blocks so load from other work hits both alike, in
a directory on the disk the checkout lives on (PostgreSQL's, on this machine). No database needed.
Run: `python bench/bench_journal.py`. Goal: below 1x (fewer flushes than two whole objects).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_runtime.effects.journal import EffectJournal, JournalEntry  # noqa: E402
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore  # noqa: E402
from bench import _run  # noqa: E402

EFFECTS = _run.size("BENCH_JOURNAL_EFFECTS", 500, smoke=10)
BLOCK = _run.size("BENCH_JOURNAL_BLOCK", 25, smoke=5)


def _entry(key: str, state: str, revision: int) -> JournalEntry:
    return JournalEntry(key, str(uuid.uuid4()), "pay", "charge", {"amount": 1000, "currency": "eur"}, "digest",
                        state, {"id": "ch_1", "status": "succeeded"} if state == "committed" else None,
                        "performed" if state == "committed" else None, 0, None, revision, time.time())


def record_object(journal: EffectJournal) -> None:
    key = uuid.uuid4().hex
    assert journal.get(key) is None
    journal.put(_entry(key, "intent", 1))
    journal.put(_entry(key, "committed", 2))


def whole_objects(journal: EffectJournal) -> None:
    key = uuid.uuid4().hex
    assert journal.get(key) is None
    for state, revision in (("intent", 1), ("committed", 2)):
        journal.store.put(journal.object_key(key), json.dumps(asdict(_entry(key, state, revision))).encode())


def main() -> None:
    with _run.Cleanup() as cleanup:
        (ROOT / "var").mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=ROOT / "var"))
        cleanup.add("remove the objects", shutil.rmtree, tmp, ignore_errors=True)
        key = os.urandom(32)
        sides: dict[str, tuple[Callable[[EffectJournal], None], EffectJournal, list[float]]] = {
            name: (fn, EffectJournal(EncryptedObjectStore(FileObjectStore(tmp / name), key, "bench-tenant")), [])
            for name, fn in (("record object", record_object), ("two whole objects", whole_objects))}
        for fn, journal, _ in sides.values():
            fn(journal)  # warm: the ledger/ directory exists, as on any instance after its first effect
        for _block in range(max(1, EFFECTS // BLOCK)):
            for fn, journal, times in sides.values():
                for _ in range(BLOCK):
                    start = time.perf_counter()
                    fn(journal)
                    times.append((time.perf_counter() - start) * 1000)
        out: dict[str, dict[str, float]] = {}
        for name, (_, _, times) in sides.items():
            p95 = statistics.quantiles(times, n=20)[18] if len(times) >= 20 else max(times)
            out[name] = {"p50_ms": statistics.median(times), "p95_ms": p95, "effects": len(times)}
            print(f"journal per effect, {name}: p50 {out[name]['p50_ms']:.3f} ms, p95 {p95:.3f} ms "
                  f"({len(times)} effects)", flush=True)
        ratio = out["record object"]["p50_ms"] / out["two whole objects"]["p50_ms"]
        print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
        _run.ratio_line("journal", "journal per effect, record object / two whole objects p50", ratio,
                        "(goal < 1x)")
        _run.write_json("journal", {"sides": out, "ratio_p50": ratio, "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
