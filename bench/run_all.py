"""``make bench``: run every benchmark in its own process, one after the other (they share 2 cores).

Each prints its figures next to an anchor measured in the same run; JSON copies land in var/bench/.
Pick some with ``python bench/run_all.py onboarding recovery``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALL = ["onboarding", "runtime", "sdk", "vault", "recovery", "langgraph", "conversations", "semantic", "releases",
       "fleet", "fleet_scale", "wake", "move"]


def main(names: list[str]) -> int:
    failed = []
    for name in names or ALL:
        print(f"\n=== bench_{name} ===", flush=True)
        if subprocess.run([sys.executable, str(HERE / f"bench_{name}.py")], cwd=HERE.parent).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
