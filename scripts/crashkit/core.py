"""The kit's vocabulary: an attack, what a run of it counted, and the resources it may create.

An attack is a function `run(kit, outcome, runs)` registered with `@attack(...)`. It creates what it needs
through `Kit` (throw-away tenant databases and roles, peers, agent-host processes, a scratch directory), and
every one of those is gone when the attack returns or raises, Ctrl-C included. It counts what went wrong at the
peers' side into `outcome.ours` (our runtime) and `outcome.plain` (plain LangGraph, where it has a side). No
attack reaches into a private part of the runtime: agent-host processes, the SDK, the LangGraph integration and
the state stores' public functions only.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from tests.runtime.harness import (
    ROOT,
    HostRunner,
    Peers,
    Proc,
    TenantDB,
    create_tenant_db,
    drop_tenant_db,
    make_env,
    start_peers,
)

__all__ = ["ATTACKS", "Attack", "Kit", "Outcome", "Tally", "attack"]

# Hosts load the kit's agents (AGENT_APP=crashkit.agents:AGENTS) from here.
KIT_PATH = f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"


@dataclass
class Tally:
    """What one side did wrong, counted at the peers: calls made twice, things that never happened (or wait
    for a human where none should be needed), and unsafe acts (unchecked files sent, an instance restarted)."""

    dup: int = 0
    lost: int = 0
    unsafe: int = 0

    def bad(self) -> int:
        return self.dup + self.lost + self.unsafe

    def cell(self) -> str:
        text = f"{self.dup} dup / {self.lost} lost"
        return text + (f" / {self.unsafe} unsafe" if self.unsafe else "")


@dataclass
class Outcome:
    name: str
    ours: Tally = field(default_factory=Tally)
    plain: Tally | None = None
    runs: int = 0
    kills: int = 0
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    @property
    def passed(self) -> bool:
        return self.error is None and self.ours.bad() == 0 and self.runs > 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ours": vars(self.ours), "plain": vars(self.plain) if self.plain else None,
                "runs": self.runs, "kills": self.kills, "notes": self.notes, "error": self.error,
                "passed": self.passed, "seconds": round(self.seconds, 1)}


@dataclass(frozen=True)
class Attack:
    name: str
    title: str  # one line: what is done
    counted: str  # where and what is counted
    run: Callable[[Kit, Outcome, int], None]
    langgraph: bool = False  # has a plain LangGraph side


ATTACKS: dict[str, Attack] = {}


def attack(name: str, title: str, counted: str, *, langgraph: bool = False
           ) -> Callable[[Callable[[Kit, Outcome, int], None]], Callable[[Kit, Outcome, int], None]]:
    def register(fn: Callable[[Kit, Outcome, int], None]) -> Callable[[Kit, Outcome, int], None]:
        ATTACKS[name] = Attack(name, title, counted, fn, langgraph)
        return fn

    return register


class Kit:
    """Resources for attacks, each released when its `with` block ends; `close()` releases what is left."""

    def __init__(self, admin_dsn: str, console: Console, keep: bool = False) -> None:
        self.admin_dsn = admin_dsn
        self.console = console
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="crash-kit-"))
        self._dbs: list[TenantDB] = []
        self._n = 0

    def say(self, text: str) -> None:
        self.console.print(f"  [dim]{time.strftime('%H:%M:%S')}[/dim] {text}", highlight=False)

    def scratch(self, label: str) -> Path:
        self._n += 1
        path = self.root / f"{self._n:02d}-{label}"
        path.mkdir(parents=True)
        return path

    @contextmanager
    def tenant(self) -> Iterator[TenantDB]:
        """A database, its tenant role and schema (`ck_<8 hex>`), dropped afterwards."""
        t = create_tenant_db(self.admin_dsn, prefix="ck")
        self._dbs.append(t)
        try:
            yield t
        finally:
            self._drop(t)

    def _drop(self, t: TenantDB) -> None:
        if t in self._dbs:
            drop_tenant_db(t, self.admin_dsn)
            self._dbs.remove(t)

    @contextmanager
    def peers(self, label: str, *, dedupe: bool = True, payments_env: dict[str, str] | None = None
              ) -> Iterator[Peers]:
        peers = start_peers(self.scratch(label), dedupe=dedupe, payments_env=payments_env)
        try:
            yield peers
        finally:
            peers.stop()

    @contextmanager
    def hosts(self, label: str) -> Iterator[HostRunner]:
        runner = HostRunner(self.scratch(label))
        try:
            yield runner
        finally:
            runner.stop_all()

    def host_env(self, t: TenantDB, base: Path, **extra: str) -> dict[str, str]:
        """agent-host's environment running the kit's agents (crashkit.agents)."""
        return make_env(t, base, AGENT_APP="crashkit.agents:AGENTS", PYTHONPATH=KIT_PATH, **extra)

    def close(self) -> None:
        """Stop every process still running, drop every database and role still there, remove the scratch
        directory (unless --keep)."""
        Proc.stop_live()
        for t in list(self._dbs):
            try:
                self._drop(t)
            except Exception as exc:  # noqa: BLE001 - keep cleaning the rest; say what is left
                print(f"crash kit: could not drop {t.dbname} / {t.role}: {exc}", file=sys.stderr)
        if self.keep:
            self.console.print(f"logs and scratch files kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.02) -> Any:
    """Poll `check` until it returns something truthy; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def settled(conn: Any, task_id: Any, timeout_s: float) -> tuple[str, str | None]:
    """Wait until the task is done, blocked, failed or cancelled; (status, blocked_reason)."""
    def check() -> tuple[str, str | None] | None:
        row = conn.execute("SELECT status, blocked_reason FROM tasks WHERE id = %s", (task_id,)).fetchone()
        return (str(row[0]), row[1]) if row and row[0] in ("done", "blocked", "failed", "cancelled") else None

    try:
        return wait_for(f"task {task_id} to settle", check, timeout_s)  # type: ignore[no-any-return]
    except TimeoutError:
        row = conn.execute("SELECT status, blocked_reason FROM tasks WHERE id = %s", (task_id,)).fetchone()
        return (f"{row[0]} (still, after {timeout_s:.0f}s)" if row else "missing", row[1] if row else None)


def tenant_store(env: dict[str, str]) -> Any:
    """The instance's object store, opened from its environment as the host opens it (to read its journal)."""
    from agent_runtime.crypto import decode_key
    from agent_runtime.state.objectstore import EncryptedObjectStore, objectstore_from_url

    return EncryptedObjectStore(objectstore_from_url(env["AGENT_OBJECTSTORE_URL"]),
                                decode_key(env["AGENT_OBJECT_KEY"]), env["AGENT_TENANT_ID"])
