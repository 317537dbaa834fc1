"""`agent-host dev PATH`: run an agent package from its source directory on a local instance, for its author.

No wheel, no release, no control plane: an embedded PostgreSQL (pgserver, the wheel the embedded default uses;
on its unix socket, started here and stopped when the last user exits) holds the instance's schema, and the
instance itself is `devreload`'s host, a child process this command supervises and restarts. The state lives
in one directory (``PATH/.agent-dev/`` unless ``--state``): the database, the volume, the object store and the
instance's identity (tenant id, object key), so the next run resumes what the last one left unfinished.

From the terminal the author submits tasks, chats with the conversational agent, lists tasks with their step
events, and SIGKILLs the instance to watch it resume; either one action per run (``--submit``, ``--chat``,
``--tasks``; with ``--wait`` and ``--kill-after-step N`` for scripts and tests) or an interactive prompt. A
second `dev` on the same state directory while one runs attaches to it (its database and host) instead of
starting another.

This module talks to the instance's tables directly (the same stores the host uses), never to Django.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from agent_runtime.db import connect
from agent_runtime.host.devreload import SourceReloader
from agent_runtime.host.loader import ENTRY_POINT_GROUP
from agent_runtime.state import tasks as task_store
from agent_runtime.state.checkpoints import CheckpointStore
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.migrations import migrate

__all__ = ["dev_main"]

SCHEMA = "dev"
FINAL = ("done", "failed", "blocked", "cancelled")
# soft_wrap: a line stays one line in a pipe or a log (rich would wrap it at 80 columns there).
console = Console(highlight=False, soft_wrap=True)


class DevError(Exception):
    """Something the author must fix (no package found, bad JSON); printed without a traceback."""


def package_apps(source: Path) -> list[str]:
    """The agent entry points the package declares in its pyproject.toml (``module:attr`` each)."""
    pyproject = source / "pyproject.toml"
    if not pyproject.is_file():
        raise DevError(f"{source} has no pyproject.toml; name the agent with --app module:attribute")
    with pyproject.open("rb") as fh:
        data = tomllib.load(fh)
    points = data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    if not points:
        raise DevError(f"{pyproject} declares no entry point in [project.entry-points.\"{ENTRY_POINT_GROUP}\"] "
                       "(see docs/sdk.md); or name the agent with --app module:attribute")
    return [str(v) for _k, v in sorted(points.items())]


@dataclass(frozen=True)
class Instance:
    """The local instance's identity and places, kept in the state directory across runs."""

    state: Path
    tenant_id: str
    object_key: str

    @classmethod
    def open(cls, state: Path) -> Instance:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        ident = state / "instance.json"
        if not ident.exists():
            data = {"tenant_id": str(uuid.uuid4()),
                    "object_key": base64.b64encode(secrets.token_bytes(32)).decode()}
            tmp = ident.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.chmod(0o600)
            tmp.replace(ident)
        data = json.loads(ident.read_text())
        return cls(state=state, tenant_id=data["tenant_id"], object_key=data["object_key"])

    @property
    def volume(self) -> Path:
        return self.state / "volume"

    @property
    def log_file(self) -> Path:
        return self.state / "host.log"

    def host_env(self, dsn: str) -> dict[str, str]:
        (self.state / "objects").mkdir(exist_ok=True, mode=0o700)
        return {"AGENT_TENANT_ID": self.tenant_id, "AGENT_SCHEMA": SCHEMA, "AGENT_DATABASE_URL": dsn,
                "AGENT_VOLUME": str(self.volume), "AGENT_OBJECTSTORE_URL": (self.state / "objects").as_uri() + "/",
                "AGENT_OBJECT_KEY": self.object_key, "AGENT_LOG_FILE": str(self.log_file),
                "AGENT_HEARTBEAT_INTERVAL_S": "1.0", "AGENT_POLL_INTERVAL_S": "0.1"}


def _forget_dead_handles(pgdata: Path) -> None:
    """pgserver stops the server when the last process using it exits, by a list of their pids it keeps in the
    data directory; a session that was SIGKILLed never takes itself off, and the server would then outlive every
    later session. Pids of processes that are gone are dropped from the list first."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (FileNotFoundError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and Path(f"/proc/{pid}").exists()]
    if alive != pids:
        handles.write_text(json.dumps(alive))


@contextlib.contextmanager
def embedded_database(state: Path) -> Iterator[str]:
    """Start (or join) the embedded PostgreSQL under ``state/pgdata``; yield a DSN on its unix socket. pgserver
    counts the processes using it and stops it when the last one exits."""
    run_dir = state / "run"
    run_dir.mkdir(exist_ok=True, mode=0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(run_dir))
    import warnings

    _forget_dead_handles(state / "pgdata")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

        server = get_server(state / "pgdata", cleanup_mode="stop")
    dsn = server.get_uri()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    yield dsn


class HostProcess:
    """The instance process: started, SIGKILLed and restarted by the author's commands."""

    def __init__(self, inst: Instance, source: Path, apps: list[str], dsn: str) -> None:
        self.inst, self.source, self.apps, self.dsn = inst, source, apps, dsn
        self.proc: subprocess.Popen[bytes] | None = None

    def _stop_orphan(self) -> None:
        """A host left running by a dev session that died (its terminal closed) still holds the schema's lock:
        this session owns the state directory now, so that host is stopped the way an instance stop does it."""
        try:
            pid = int((self.inst.volume / ".host" / "pid").read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ValueError):
            return
        if b"agent_runtime.host.devreload" not in cmdline:
            return
        console.print(f"stopping the instance a previous dev session left running (pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)

    def start(self) -> dict[str, Any]:
        """Start the host and wait until it has read its state back; return its boot event's detail."""
        self._stop_orphan()
        status = self.inst.volume / ".host" / "status"
        status.unlink(missing_ok=True)
        env = {**os.environ, **self.inst.host_env(self.dsn), "PYTHONPATH": os.pathsep.join(
            [str(self.source), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with self.inst.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent_runtime.host.devreload", str(self.source), *self.apps],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DevError(f"the instance exited with {self.proc.returncode} while starting; see "
                               f"{self.inst.log_file}:\n{_tail(self.inst.log_file)}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                state = json.loads(status.read_text())
                if state.get("state") == "agent_load_failed":
                    self.stop()
                    raise DevError(f"the agent package failed to load:\n{_tail(self.inst.log_file)}")
                if state.get("state") == "ready" and state.get("pid") == self.proc.pid:
                    return self.boot_event()
            time.sleep(0.05)
        raise DevError(f"the instance did not become ready in 60 s; see {self.inst.log_file}")

    def boot_event(self) -> dict[str, Any]:
        with connect(self.dsn, SCHEMA, autocommit=True) as conn:
            row = conn.execute("SELECT detail FROM host_events WHERE kind = 'boot' ORDER BY id DESC LIMIT 1"
                               ).fetchone()
        return dict(row[0]) if row else {}

    def kill(self) -> int:
        """SIGKILL, as an OOM kill would: nothing of the current step is committed."""
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM: the host stops after the current step (its grace period), as an instance stop does."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return ""
    return "\n".join(lines)


def print_boot(boot: dict[str, Any], *, after_kill: int | None = None) -> None:
    resumable = boot.get("resumable") or []
    head = f"instance restarted after SIGKILL of pid {after_kill}" if after_kill else "instance ready"
    console.print(f"[bold green]{head}[/] (pid {boot.get('pid')}, read back in {boot.get('read_back_ms')} ms)")
    for item in resumable:
        console.print(f"  resume: task {item['task']} from its checkpoint after step "
                      f"[bold]{item.get('step') or '(none yet)'}[/]")


class Session:
    """What the author does, against one instance's schema."""

    def __init__(self, inst: Instance, source: Path, apps: list[str], dsn: str, host: HostProcess | None) -> None:
        self.inst, self.source, self.apps, self.dsn, self.host = inst, source, apps, dsn, host
        self.conn = connect(dsn, SCHEMA, autocommit=True, application_name="agent-host-dev")
        migrate(self.conn, SCHEMA)
        self._reloader: SourceReloader | None = None

    def submit(self, kind: str, params: dict[str, Any]) -> uuid.UUID:
        task_id = task_store.submit(self.conn, kind, params)
        console.print(f"submitted [bold]{kind}[/] task {task_id}")
        return task_id

    def _chat_kind(self) -> str:
        if self._reloader is None:
            self._reloader = SourceReloader(self.source, self.apps)
        else:
            self._reloader.refresh()
        kinds = sorted(k for k, a in self._reloader.loaded.agents.items() if getattr(a, "conversational", False))
        if len(kinds) != 1:
            raise DevError("no conversational agent in the package (Agent(..., conversational=True))" if not kinds
                           else f"several conversational agents: {', '.join(kinds)}")
        return kinds[0]

    def chat(self, thread: str, text: str) -> uuid.UUID:
        """Post a message as the instance API does: the message and its task in one transaction."""
        kind, mid = self._chat_kind(), uuid.uuid4()
        with self.conn.transaction():
            task_store.submit_once(self.conn, mid, kind, {"thread": thread, "question": text, "message_id": str(mid)})
            MemoryStore(self.conn).in_thread(thread).append(
                "user", text, {"task": str(mid), "turn": "question", "message_id": str(mid)})
        console.print(f"[bold]you[/] ({thread}): {text}")
        return mid

    def reply(self, task_id: uuid.UUID) -> str | None:
        row = self.conn.execute("SELECT content FROM messages WHERE metadata->>'task' = %s AND metadata->>'turn' = "
                                "'answer' ORDER BY seq LIMIT 1", (str(task_id),)).fetchone()
        return str(row[0]) if row else None

    def task(self, task_id: uuid.UUID) -> task_store.Task | None:
        return task_store.get(self.conn, task_id)

    def events(self, task_id: uuid.UUID, after: int = 0) -> list[tuple[int, str, str]]:
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT id, step, event FROM step_events WHERE task_id = %s AND id > %s ORDER BY id", (task_id, after))]

    def watch(self, task_id: uuid.UUID, *, kill_after_step: int | None = None, timeout_s: float = 300) -> str:
        """Print the task's step events until it ends; SIGKILL the instance once ``kill_after_step`` steps are
        done and the next one has started, restart it and print what it resumes. Returns the final status."""
        last, done_steps, killed = 0, 0, False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            latest = None
            for eid, step, event in self.events(task_id, last):
                last, latest = eid, event
                colour = {"done": "green", "failed": "red", "start": "cyan"}.get(event, "yellow")
                console.print(f"  step [bold]{step}[/] [{colour}]{event}[/]")
                done_steps += event == "done"
            # Killed only while the step that started is still the task's latest event (no 'done' read after it):
            # on a slow machine one read can bring a step's start and its end together, and a kill after the end
            # would land between steps, not inside one.
            if (kill_after_step is not None and not killed and latest == "start"
                    and done_steps == kill_after_step and self.host is not None):
                self.kill()
                killed = True
            task = self.task(task_id)
            if task is not None and task.status in FINAL:
                self.print_outcome(task)
                return task.status
            if self.host is not None and not self.host.alive():
                console.print("[red]the instance exited[/]; restarting it")
                print_boot(self.host.start())
            time.sleep(0.05)
        raise DevError(f"task {task_id} did not end within {timeout_s:.0f} s")

    def print_outcome(self, task: task_store.Task) -> None:
        colour = "green" if task.status == "done" else "red"
        console.print(f"task {task.id} [{colour}]{task.status}[/]"
                      + (f": {task.blocked_reason}: {task.blocked_detail}" if task.blocked_reason else ""))
        if task.status == "done":
            store = CheckpointStore(self.conn)
            console.print_json(json.dumps(store.case_file(store.latest(task.id)).steps_done, default=str),
                               indent=None)
        answer = self.reply(task.id)
        if answer is not None:
            console.print(f"[bold]agent[/]: {answer}")

    def kill(self) -> None:
        if self.host is None:
            raise DevError("attached to another dev session: kill from that one")
        pid = self.host.kill()
        console.print(f"[bold red]SIGKILL[/] instance pid {pid}")
        print_boot(self.host.start(), after_kill=pid)

    def tasks(self, limit: int = 20) -> None:
        table = Table("task", "kind", "status", "steps (events)", "blocked", title="tasks (newest first)")
        for tid, kind, status, reason in self.conn.execute(
                "SELECT id, kind, status, blocked_reason FROM tasks ORDER BY created_at DESC LIMIT %s", (limit,)):
            events = " ".join(f"{step}:{event}" for _id, step, event in self.events(tid))
            table.add_row(str(tid)[:8], kind, status, events, reason or "")
        console.print(table)


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise DevError(f"params are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DevError("params must be a JSON object")
    return value


HELP = """commands:
  submit KIND [JSON]     submit a task (params as a JSON object) and follow its steps
  chat TEXT              send a message to the conversational agent and print its reply
  thread NAME            the thread chat messages go to (default: dev)
  tasks                  list tasks with their status and step events
  kill                   SIGKILL the instance mid-whatever, restart it, show what it resumes
  quit                   stop the instance after its current step and leave (state is kept)"""


def _log_follower(log_file: Path, stop: threading.Event) -> None:
    """Print the host's reload events as they happen (the author saved a file)."""
    with contextlib.suppress(FileNotFoundError):
        fh = log_file.open()
        fh.seek(0, os.SEEK_END)
        while not stop.wait(0.2):
            for line in fh.readlines():
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if rec.get("event") == "agent_reloaded":
                        console.print(f"[magenta]reloaded[/] {', '.join(rec.get('files', []))}: the next step runs "
                                      "the new code")
                    elif rec.get("event") == "agent_reload_failed":
                        console.print(f"[red]reload failed[/] (previous code still runs): {rec.get('error')}")


def interactive(session: Session) -> int:
    console.print(HELP)
    thread = "dev"
    stop = threading.Event()
    threading.Thread(target=_log_follower, args=(session.inst.log_file, stop), daemon=True).start()
    try:
        while True:
            try:
                line = input("dev> ").strip()
            except EOFError:
                return 0
            if not line:
                continue
            cmd, _, rest = line.partition(" ")
            rest = rest.strip()
            try:
                if cmd in ("quit", "exit"):
                    return 0
                if cmd == "submit" and rest:
                    kind, _, raw = rest.partition(" ")
                    session.watch(session.submit(kind, _json_object(raw.strip() or "{}")))
                elif cmd == "chat" and rest:
                    session.watch(session.chat(thread, rest))
                elif cmd == "thread" and rest:
                    thread = rest
                    console.print(f"chat goes to thread {thread!r}")
                elif cmd == "tasks":
                    session.tasks()
                elif cmd == "kill":
                    session.kill()
                else:
                    console.print(HELP)
            except (DevError, ValueError) as exc:
                console.print(f"[red]{exc}[/]")
    finally:
        stop.set()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent-host dev", description="Run an agent package from its source directory on a local instance "
        "(embedded PostgreSQL, no wheel, no control plane); the code reloads at the next step after a save. "
        "Without an action it opens a prompt.\n\n" + HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=Path, help="the package's source directory (with its pyproject.toml)")
    p.add_argument("--state", type=Path, help="state directory (default: PATH/.agent-dev)")
    p.add_argument("--app", action="append", help="module:attribute naming the agent(s), instead of the "
                                                  "pyproject's entry points (repeatable)")
    p.add_argument("--submit", nargs=2, metavar=("KIND", "JSON"), help="submit one task")
    p.add_argument("--chat", nargs=2, metavar=("THREAD", "TEXT"), help="send one message")
    p.add_argument("--tasks", action="store_true", help="list tasks and their step events")
    p.add_argument("--wait", action="store_true", help="follow the submitted task until it ends")
    p.add_argument("--kill-after-step", type=int, metavar="N", help="with --wait: SIGKILL the instance once N "
                   "steps are done and the next has started, restart it, show the resume")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits (default 300)")
    return p


@contextlib.contextmanager
def _session_lock(state: Path) -> Iterator[bool]:
    """True when this is the only dev session on ``state`` (it runs the instance); False: attach to the one that
    runs it."""
    fd = os.open(state / "dev.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            owner = True
        except BlockingIOError:
            owner = False
        yield owner
    finally:
        os.close(fd)


def dev_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except DevError as exc:
        console.print(f"[red]agent-host dev:[/] {exc}")
        return 2


def _run(args: argparse.Namespace) -> int:
    source: Path = args.path.resolve()
    if not source.is_dir():
        raise DevError(f"{source} is not a directory")
    apps = args.app or package_apps(source)
    inst = Instance.open((args.state or source / ".agent-dev").resolve())
    with _session_lock(inst.state) as owner, embedded_database(inst.state) as dsn:
        host = HostProcess(inst, source, apps, dsn) if owner else None
        if host is not None:
            print_boot(host.start())
        else:
            console.print(f"attached to the dev session running on {inst.state}")
        try:
            session = Session(inst, source, apps, dsn, host)
            if not (args.submit or args.chat or args.tasks):
                return interactive(session)
            task_id = None
            if args.submit:
                task_id = session.submit(args.submit[0], _json_object(args.submit[1]))
            elif args.chat:
                task_id = session.chat(args.chat[0], args.chat[1])
            status = "done"
            if task_id is not None and (args.wait or args.chat or args.kill_after_step is not None):
                status = session.watch(task_id, kill_after_step=args.kill_after_step, timeout_s=args.timeout)
            if args.tasks:
                session.tasks()
            return 0 if status == "done" else 1
        finally:
            if host is not None:
                host.stop()
