"""The crash kit (`make crash-kit`): the runtime's attacks and the LangGraph duplicate-execution scenarios, run
against our runtime and the plain LangGraph checkpointer side by side, each counted at the real peers.

    .venv/bin/python scripts/crash_kit.py [--runs N] [--only NAME ...] [--list] [--keep] [--json PATH]

Runs on DATABASE_URL's server (or the embedded one) in throw-away databases and roles it drops at exit. The
attacks are in scripts/crashkit/; docs/runtime.md ("Crash kit") says what each one checks.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from crashkit.cli import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    sys.exit(main())
