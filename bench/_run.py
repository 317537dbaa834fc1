"""How a benchmark runs and reports, for every bench (the Django-free ones too): its size, its ratio line and its
clean-up.

``BENCH_SMOKE=1`` (``make bench-smoke``, ``bench/run_all.py --smoke``) runs each bench at a tiny size, so CI sees
a bench break without paying for its figures; a size's own environment variable wins over both. No database or
Django here: ``bench/_setup.py`` creates a database when imported, and not every bench wants one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["SMOKE", "size", "seconds", "ratio_line", "write_json", "Cleanup"]

SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0", "false")


def size(env: str, full: int, smoke: int) -> int:
    """``$env`` when set, else ``smoke`` under BENCH_SMOKE, else ``full``."""
    value = os.environ.get(env, "")
    return int(value) if value else (smoke if SMOKE else full)


def seconds(env: str, full: float, smoke: float) -> float:
    value = os.environ.get(env, "")
    return float(value) if value else (smoke if SMOKE else full)


def ratio_line(bench: str, what: str, ratio: float, anchor: str) -> str:
    """The one line per claimed ratio that ``make bench-smoke``'s test looks for (rich tables wrap and cut cells
    when stdout is not a terminal, so the ratio is printed plain as well); returns it."""
    shown = f"{ratio:.2f}x" if math.isfinite(ratio) else "n/a"
    line = f"ratio {bench}: {what} = {shown} {anchor} (same run)"
    print(line, flush=True)
    return line


def write_json(name: str, data: Any) -> Path:
    """The run's figures as var/bench/<name>.json (a smoke run's under var/bench/smoke/: it never replaces the last
    real run's)."""
    results = Path(__file__).resolve().parent.parent / "var" / "bench" / ("smoke" if SMOKE else "")
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


class Cleanup:
    """Clean-up steps run last in, first out when the ``with`` block ends, each one whatever the others did.

    A step that fails is reported on stderr and never replaces the error the block itself raised (that one is the
    finding); when the block succeeded, the first failed step's error is raised after all steps ran.
    """

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def add(self, label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._steps.append((label, fn, args, kwargs))

    def __enter__(self) -> Cleanup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        first: BaseException | None = None
        while self._steps:
            label, fn, args, kwargs = self._steps.pop()
            try:
                fn(*args, **kwargs)
            except Exception as step_exc:  # noqa: BLE001 - reported here, raised below only if nothing else was
                print(f"clean-up step {label!r} failed: {''.join(traceback.format_exception_only(step_exc)).strip()}",
                      file=sys.stderr, flush=True)
                first = first or step_exc
        if first is not None and exc is None:
            raise first
