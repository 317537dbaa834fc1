"""Command line of the crash kit: pick attacks, run each `--runs` times, print progress and the closing table.

Exit code 0 only when our runtime produced no duplicate, loss or unsafe act in any attack and every attack ran;
1 otherwise. Everything created (databases, roles, processes, files) is gone at exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table

from tests.runtime.harness import admin_dsn

from . import host_faults, langgraph_attacks, payments, workspace  # noqa: F401 - they register the attacks
from .core import ATTACKS, Kit, Outcome

DEFAULT_RUNS = 3
# The order: the runtime's attacks, then the upstream LangGraph scenarios.
ORDER = ("payment-search-lag", "journal-before-table", "lg-schema-restore", "workspace-restore-mid-release",
         "interleaved-threads", "nan-step", "stalled-db-healthz", "lg-timeout-retry", "lg-crash-before-checkpoint",
         "lg-interrupt-loop")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/crash_kit.py",
        description="Run the crash kit's attacks against agent_runtime (and the plain LangGraph checkpointer, side "
                    "by side) on throw-away databases of DATABASE_URL's server (or the embedded one), and print the "
                    "duplicates and losses each produced, counted at the real peers.")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"runs per attack (default {DEFAULT_RUNS})")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this attack (repeat, or comma-separate); --list shows the names")
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs) at exit")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        parser.error(f"unknown attack(s) {', '.join(unknown)}; one of: {', '.join(ATTACKS)}")
    args.names = names or sorted(ATTACKS, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    return args


def _table(results: list[Outcome], runs_total_s: float) -> Table:
    table = Table(title=f"crash kit: {len(results)} attack(s) in {runs_total_s:.0f} s", title_justify="left")
    table.add_column("attack", no_wrap=True)
    table.add_column("ours: dup / lost")
    table.add_column("plain LangGraph: dup / lost")
    table.add_column("runs", justify="right")
    table.add_column("kills", justify="right")
    table.add_column("verdict")
    for out in results:
        plain = "-" if out.plain is None else out.plain.cell() + ("" if out.plain.bad() else " (not reproduced)")
        if out.error is not None:
            verdict = "[red]FAIL (error)[/red]"
        else:
            verdict = "[green]pass[/green]" if out.passed else "[red]FAIL[/red]"
        table.add_row(out.name, out.ours.cell(), plain, str(out.runs), str(out.kills), verdict)
    return table


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # A pipe or a file gets a table as wide as a terminal's, not 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=132)
    if args.list:
        for a in (ATTACKS[n] for n in args.names):
            console.print(f"[bold]{a.name}[/bold]{' (LangGraph, side by side)' if a.langgraph else ''}: {a.title}; "
                          f"counted: {a.counted}", highlight=False)
        return 0

    def terminate(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)  # also when started in the background, where SIGINT comes ignored
    try:
        admin = admin_dsn()
    except Exception as exc:  # noqa: BLE001 - one sentence, not a traceback
        console.print(f"crash kit: no PostgreSQL server to run on ({type(exc).__name__}: {exc})")
        return 2
    kit = Kit(admin, console, keep=args.keep)
    # What the runtime logs in this process (LangGraph attacks) goes to the scratch directory, not the progress.
    logging.basicConfig(filename=kit.root / "kit.log", level=logging.INFO, force=True)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
    results: list[Outcome] = []
    started = time.monotonic()
    interrupted = False
    try:
        for name in args.names:
            a = ATTACKS[name]
            console.rule(f"[bold]{a.name}[/bold]", align="left")
            console.print(f"  {a.title}\n  counted: {a.counted}", highlight=False)
            out = Outcome(a.name)
            results.append(out)
            t0 = time.monotonic()
            try:
                a.run(kit, out, args.runs)
            except KeyboardInterrupt:
                out.error = "interrupted"
                raise
            except Exception as exc:  # noqa: BLE001 - an attack that breaks is reported, the next one runs
                out.error = f"{type(exc).__name__}: {exc}"[:800]
                kit.say(f"[red]error:[/red] {out.error}")
            finally:
                out.seconds = time.monotonic() - t0
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: cleaning up[/yellow]")
    finally:
        kit.close()
    console.print()
    console.print(_table(results, time.monotonic() - started))
    for out in results:
        for text in ([f"[red]{out.error}[/red]"] if out.error else []) + out.notes:
            console.print(f"  {out.name}: {text}", highlight=False)
    if args.json:
        args.json.write_text(json.dumps({"interrupted": interrupted, "seconds": round(time.monotonic() - started, 1),
                                         "attacks": [o.as_dict() for o in results]}, indent=1))
    ok = not interrupted and all(o.passed for o in results)
    console.print("[green]our runtime: no duplicate, no loss[/green]" if ok else
                  "[red]our runtime: duplicates, losses or errors above[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
