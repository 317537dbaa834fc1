"""``make bench``: run every benchmark in its own process, one after the other (they share 2 cores).

Each prints its figures next to an anchor measured in the same run, and one ``ratio <bench>: ...`` line per ratio
it claims; JSON copies land in var/bench/. Pick some with ``python bench/run_all.py onboarding recovery``.
``--smoke`` (``make bench-smoke``; the same as ``BENCH_SMOKE=1``) runs each at a tiny size, two at a time: a check
that every bench still runs end to end (tests/test_bench_smoke.py runs it in CI), not a measurement.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALL = ["onboarding", "runtime", "sdk", "vault", "recovery", "langgraph", "conversations", "semantic", "releases",
       "fleet", "fleet_scale", "wake", "move", "journal", "connections", "mcp", "schedules", "isolation", "idle",
       "streams"]
# Smoke runs start the slowest first, so two lanes finish together (seconds each took at smoke size, loaded VM).
SMOKE_ORDER = ["recovery", "move", "isolation", "releases", "fleet_scale", "onboarding", "schedules", "wake", "fleet",
               "conversations", "streams", "vault", "sdk", "semantic", "langgraph", "runtime", "mcp", "journal",
               "connections", "idle"]
SMOKE_TIMEOUT_S = 300.0  # one bench at smoke size; the slowest (recovery) takes one to one and a half minutes
RUNNING: set[subprocess.Popen[bytes]] = set()  # benches under way, for a Ctrl-C to pass on to all of them


def run_one(name: str, env: dict[str, str], timeout: float | None, *, capture: bool) -> tuple[str, float, str]:
    """(outcome: 'ok', 'failed (exit N)' or 'timed out'; seconds; its output when ``capture``, else streamed).

    A bench past its timeout gets SIGINT first, so its clean-up runs (its processes, database and roles), then its
    whole process group is killed."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, str(HERE / f"bench_{name}.py")], cwd=HERE.parent, env=env,
                                stdout=out if capture else None, stderr=subprocess.STDOUT if capture else None,
                                start_new_session=True)  # its own group: what it started can be killed with it
        RUNNING.add(proc)
        try:
            code = proc.wait(timeout)
            outcome = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            _interrupt(proc)
            outcome = "timed out"
        except KeyboardInterrupt:  # Ctrl-C reaches this process only (the bench has its own session): pass it on
            _interrupt(proc)
            raise
        finally:
            RUNNING.discard(proc)
        out.seek(0)
        return outcome, time.monotonic() - start, out.read().decode(errors="replace")


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="bench", help=f"some of: {', '.join(ALL)} (default: all)")
    parser.add_argument("--smoke", action="store_true", help="each bench at a tiny size (BENCH_SMOKE=1)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="benches at once (default 1; 2 with --smoke, where nothing is measured)")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"seconds per bench (default: none; {SMOKE_TIMEOUT_S:.0f} with --smoke)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ALL]
    if unknown:
        parser.error(f"no such bench: {', '.join(unknown)}")
    env = dict(os.environ)
    if args.smoke:
        env["BENCH_SMOKE"] = "1"
    smoke = env.get("BENCH_SMOKE", "") not in ("", "0", "false")
    timeout = args.timeout if args.timeout is not None else (SMOKE_TIMEOUT_S if smoke else None)
    jobs = max(1, args.jobs if args.jobs is not None else (2 if smoke else 1))
    names = args.names or ALL
    if smoke:
        names = sorted(names, key=SMOKE_ORDER.index)
    began = time.monotonic()
    outcomes: dict[str, tuple[str, float]] = {}
    if jobs == 1:  # a full run: each bench's progress as it happens
        for name in names:
            print(f"\n=== bench_{name} ===", flush=True)
            outcome, took, _ = run_one(name, env, timeout, capture=False)
            outcomes[name] = (outcome, took)
    else:  # each bench's output printed whole once it is done, so two never interleave
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_one, name, env, timeout, capture=True): name for name in names}
            try:
                for future in futures:
                    outcome, took, output = future.result()
                    outcomes[futures[future]] = (outcome, took)
                    print(f"\n=== bench_{futures[future]} ===\n{output}", end="", flush=True)
            except KeyboardInterrupt:
                for future in futures:
                    future.cancel()
                for proc in list(RUNNING):
                    proc.send_signal(signal.SIGINT)  # each bench's clean-up runs; its lane's wait then returns
                raise
    print(f"\n=== {'smoke ' if smoke else ''}summary: {len(outcomes)} benches in {time.monotonic() - began:.0f} s"
          f"{f', {jobs} at a time' if jobs > 1 else ''} ===")
    for name, (outcome, took) in outcomes.items():
        print(f"bench_{name}: {outcome} in {took:.0f} s")
    failed = [name for name, (outcome, _) in outcomes.items() if outcome != "ok"]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
