"""The crash kit runs as its users run it (`scripts/crash_kit.py` in a process of its own, no pytest inside): a
fast subset, once each. Ours must show no duplicate or loss and exit 0; the plain LangGraph anchor must show its
duplicates, so the kit can fail (a kit that counts nothing would pass everything)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

FAST = ["lg-interrupt-loop", "journal-before-table", "nan-step"]


def test_the_crash_kit_counts_at_the_peers_and_passes_our_runtime(tmp_path: Path) -> None:
    report = tmp_path / "kit.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "crash_kit.py"), "--runs", "1",
                           "--only", ",".join(FAST), "--json", str(report)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    results = {a["name"]: a for a in json.loads(report.read_text())["attacks"]}
    assert list(results) == FAST
    for name, a in results.items():
        assert a["error"] is None and a["runs"] == 1, (name, a)
        assert a["ours"] == {"dup": 0, "lost": 0, "unsafe": 0}, (name, a)
    assert results["lg-interrupt-loop"]["plain"]["dup"] > 0  # PostgresSaver + a plain tool charged again
    assert results["journal-before-table"]["kills"] == 1
    table = proc.stdout[proc.stdout.index("crash kit: 3 attack(s)"):]
    for name in FAST:
        assert name in table
    assert table.count("pass") == len(FAST) and "FAIL" not in table
