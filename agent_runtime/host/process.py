"""The `agent-host` process: one tenant's agent instance.

Start-up reads back before acting: single-writer lock, migrations, the agents of the installed package or of the
operator's release (`loader`; the boot event names the release; a package that fails to load leaves the host up
and not ready, saying why), in-doubt effects (resolved through the ledger: the effect journal first, then a
provider lookup trusted only past its consistency window, a key-safe repeat, or blocked for a human), unfinished
tasks and their latest good checkpoints, the memory window, the semantic index; only then /readyz turns 200 and
tasks resume (interrupted ones first). /healthz is 200 only while the progress marker advances within the step's
timeout and, between steps, the worker's poll for tasks completes (a database stalled under an idle worker is
unhealthy too). An effect in doubt makes its task wait, with backoff, and try again by itself. SIGTERM: stop
after the current step (or abandon it at the end of the grace period), record a clean shutdown, exit 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from agent_runtime.db import connect, lock_key, reusable
from agent_runtime.effects.config import adapters_from_env
from agent_runtime.errors import (
    AgentLoadError,
    ConfigError,
    CorruptState,
    CredentialUnavailable,
    EffectFailed,
    EffectInDoubt,
    RuntimeStateError,
    SchemaTooNew,
    TaskBlocked,
)
from agent_runtime.host.agent_config import ConfigSource, ControlPlaneConfigSource
from agent_runtime.host.api import ApiError, InstanceAPI
from agent_runtime.host.config import HostConfig
from agent_runtime.host.connections import ConnectionSource, ControlPlaneConnectionSource, EnvConnectionSource
from agent_runtime.host.credentials import ControlPlaneCredentialSource, CredentialSource, EnvCredentialSource
from agent_runtime.host.loader import LoadedAgents, load_agents
from agent_runtime.host.memory_upkeep import extractive_summary, roll_over_threads
from agent_runtime.host.netforward import start_forwards
from agent_runtime.host.pinned import run_pinned
from agent_runtime.host.progress import ProgressMarker
from agent_runtime.host.release_policy import Pinned, Unavailable, loadable_digests, place
from agent_runtime.host.runner import Runtime, discard_rolled_back_workdirs, run_task
from agent_runtime.host.schedules import ControlPlaneSchedules
from agent_runtime.internal_api import KeptAlivePoster
from agent_runtime.mcp.config import servers_from_env
from agent_runtime.state import tasks as task_store
from agent_runtime.state.fence import (
    is_fence_error,
    lease_acquire,
    lease_release,
    lease_renew,
    lease_renew_holding_lock,
)
from agent_runtime.state.migrations import migrate
from agent_runtime.state.objectstore import EncryptedObjectStore, objectstore_from_url

__all__ = ["EXIT_CONFIG", "EXIT_LOCKED", "EXIT_LOCK_LOST", "EXIT_SCHEMA", "EXIT_WORKER_DIED", "Host"]

log = logging.getLogger("agent_runtime.host")

EXIT_CONFIG = 2
EXIT_LOCKED = 3
EXIT_SCHEMA = 4
EXIT_WORKER_DIED = 5
EXIT_LOCK_LOST = 6
# How often the lease session proves it still holds its advisory lock (``pg_locks``, whose cost grows with every
# session on the server); the lease itself is renewed every heartbeat interval.
LOCK_CHECK_S = 30.0
# Of a stop's grace period, what the host keeps for itself after waiting for the worker: the stop's records, the
# lease's release and the last heartbeat (the HTTP server ends at once, ``HostHTTPServer``). The rest is the step's:
# an effect under way then finishes rather than being cut and left in doubt.
STOP_RESERVE_S = 0.1


class HostHTTPServer(ThreadingHTTPServer):
    """The host's HTTP server, whose loop sleeps until a request comes: no timer wakes an idle host.

    The standard library's ``serve_forever`` looks for a shutdown request every ``poll_interval`` (0.5 s by
    default): twice a second for every idle instance on the machine. Here it blocks in ``select`` with no timeout,
    and ``shutdown`` connects to the listening socket until the loop has seen the request and ended.
    """

    daemon_threads = True

    def serve_until_shutdown(self) -> None:
        self.serve_forever(poll_interval=None)  # type: ignore[arg-type]  # None: select() blocks until a request

    def shutdown(self) -> None:
        asked = threading.Thread(target=super().shutdown, name="http-shutdown", daemon=True)
        asked.start()
        host, port = self.server_address[:2]
        while asked.is_alive():
            with contextlib.suppress(OSError):
                socket.create_connection((str(host), int(port)), timeout=0.5).close()
            asked.join(0.05)


def release_boot_memory() -> None:
    """Give the heap that boot used and freed (imports, the read-back's rows) back to the system.

    glibc keeps freed memory in its arenas for the next allocation; an instance that goes idle after boot would
    hold it for nothing. Collect first, then ``malloc_trim(0)``; without glibc (musl, macOS), only collect."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Host:
    def __init__(self, cfg: HostConfig) -> None:
        self.cfg = cfg
        self.progress = ProgressMarker()
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.worker: threading.Thread | None = None
        self.db_probe: threading.Thread | None = None
        self.read_back: dict[str, Any] = {}
        self.lock_conn: psycopg.Connection | None = None
        self.agents: LoadedAgents | None = None
        self.load_error: str | None = None
        # task id -> (failed lookups so far, monotonic time before which it is not retried)
        self._backoff: dict[str, tuple[int, float]] = {}
        self.worker_error: str | None = None
        # Named in application_name on every connection that writes: the fence trigger checks it.
        self.holder = uuid.uuid4().hex[:16]
        self.application_name = f"agent-host:{self.holder}"
        self.lease_generation = 0
        self._memory_seq = 0  # messages up to here were looked at by memory upkeep
        self.lock_lost: str | None = None
        self._db_ok_at = time.monotonic()
        # The worker's own poll for tasks (its connection, not the lease's): when the one under way started (None:
        # none is) and when one last completed. A poll stuck behind a lock or a stalled connection shows here.
        self._poll_started_at: float | None = None
        self._poll_done_at = time.monotonic()
        self.runtime: Runtime | None = None  # set once the read-back is done: the instance API serves from then on
        self._wake = threading.Event()  # the instance API enqueued work: look now, not at the next poll
        self._credentials_checked_at = 0.0  # when the tasks blocked on a missing credential were last re-checked
        self._listening = False  # the lease's session LISTENs for new tasks (direct connections only)
        self._lock_checked_at = 0.0  # when the lease session last proved it holds its advisory lock (pg_locks)
        self._beats: KeptAlivePoster | None = None  # the heartbeat's kept-alive connection, made at the first beat
        # Set when the main thread has something to look at (a stop, the worker's end): it waits on this, not a timer.
        self._attention = threading.Event()
        self._stop_r, self._stop_w = os.pipe()  # written once on a stop: ends the LISTEN's blocking read
        os.set_blocking(self._stop_w, False)

    def wake_worker(self) -> None:
        self._wake.set()

    def _request_stop(self) -> None:
        """Stop at the next boundary; safe in a signal handler. Wakes the main thread and the LISTEN's read."""
        self.stop_event.set()
        self._attention.set()
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")

    # --- wiring ------------------------------------------------------------------------------
    def credentials(self) -> CredentialSource:
        if self.cfg.control_plane_url and self.cfg.instance_token:
            return ControlPlaneCredentialSource(self.cfg.control_plane_url, self.cfg.instance_token)
        return EnvCredentialSource()

    def connections(self) -> ConnectionSource:
        if self.cfg.control_plane_url and self.cfg.instance_token:
            return ControlPlaneConnectionSource(self.cfg.control_plane_url, self.cfg.instance_token)
        return EnvConnectionSource()

    def schedules(self) -> ControlPlaneSchedules | None:
        """Where `ctx.schedule` makes schedules: the control plane; without one there is nothing to fire them."""
        if self.cfg.control_plane_url and self.cfg.instance_token:
            return ControlPlaneSchedules(self.cfg.control_plane_url, self.cfg.instance_token)
        return None

    def config_source(self) -> ConfigSource | None:
        """Asked per task: with a control plane, its current answer (a change reaches the next task); without
        one, None: every task gets AGENT_CONFIG (the base of every answer, Runtime.config_fetch)."""
        if self.cfg.control_plane_url and self.cfg.instance_token:
            return ControlPlaneConfigSource(self.cfg.control_plane_url, self.cfg.instance_token)
        return None

    def build_runtime(self, conn: psycopg.Connection) -> Runtime:
        store = EncryptedObjectStore(objectstore_from_url(self.cfg.objectstore_url), self.cfg.object_key,
                                     self.cfg.tenant_id, self.cfg.previous_object_keys)
        creds = self.credentials()
        return Runtime(conn=conn, tenant_id=self.cfg.tenant_id, volume=self.cfg.volume, store=store,
                       credentials=creds, effects=adapters_from_env(self.cfg.effects_env, creds),
                       connections=self.connections(), schedules=self.schedules(),
                       mcp_servers=servers_from_env(self.cfg.mcp_servers_env),
                       agent_config=dict(self.cfg.agent_config), config_source=self.config_source(),
                       progress=self.progress,
                       stop_event=self.stop_event, on_workspace_mismatch=self.cfg.on_workspace_mismatch,
                       checkpoint_interval_s=self.cfg.checkpoint_interval_s,
                       keep_latest=self.cfg.checkpoint_keep_latest, step_max_attempts=self.cfg.step_max_attempts,
                       trace_spans_per_task=self.cfg.trace_spans_per_task, trace_keep_days=self.cfg.trace_keep_days)

    def load_agents(self) -> bool:
        """Load the instance's agents; on failure remember why (for /readyz, heartbeats, the log)."""
        try:
            self.agents = load_agents(self.cfg.agent_app, self.cfg.agent_kinds, release_path=self.cfg.release_path,
                                      release=self._release_label())
        except AgentLoadError as exc:
            self.load_error = str(exc)
            self.progress.set_status("agent_load_failed")
            log.error("agent package could not be loaded; staying up, not ready",
                      extra={"event": "agent_load_failed", "error": self.load_error})
            return False
        log.info("agents loaded", extra={"event": "agents_loaded", "agents": self.agents.describe()})
        return True

    def _release_label(self) -> str:
        """How errors name the release: by version and digest, as the operator knows it."""
        release = self.cfg.release
        if release is None:
            return ""
        return f"release {release['version'] or '(no version)'} ({release['digest'] or 'no digest'})"

    # --- start-up ----------------------------------------------------------------------------
    def acquire_single_writer_lock(self) -> None:
        """The session advisory lock (direct connections only): a live second host is refused at once."""
        self.lock_conn = connect(self.cfg.database_url, self.cfg.schema, autocommit=True,
                                 application_name=self.application_name, pooled=self.cfg.database_pooled)
        if self.cfg.database_pooled:
            return  # a pooled server session is shared: only the lease can decide (acquire_lease)
        row = self.lock_conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key("host", self.cfg.schema),)
        ).fetchone()
        if not (row and row[0]):
            raise SystemExit(self._die(EXIT_LOCKED, f"another agent-host is already running against schema "
                                                    f"{self.cfg.schema}; refusing to start a second writer"))
        # This session renews the lease every heartbeat interval, idle or not: a flushed commit each time was an
        # idle host's largest database cost (docs/benchmarks.md, "Idle instances"). Its commits need not wait for
        # the WAL's flush: a renewal lost to a server crash only shortens the lease (the session and its lock die
        # with the server, and the fence, not the expiry, refuses a deposed writer), and any later synchronous
        # commit flushes the WAL up to it first. The few records this session writes at a stop turn it back on
        # (``_records_durable``).
        self.lock_conn.execute("SET synchronous_commit = off")

    def _records_durable(self) -> None:
        """The lease session's next commits wait for the WAL's flush again: the stop's and crash's records."""
        if self.lock_conn is not None and not self.cfg.database_pooled:
            self.lock_conn.execute("SET synchronous_commit = on")

    def _reopen(self, dropped: psycopg.Connection) -> psycopg.Connection:
        """Pooled mode: a new client connection to the pooler in place of one it dropped."""
        dropped.close()
        return connect(self.cfg.database_url, self.cfg.schema, autocommit=True,
                       application_name=self.application_name, pooled=True)

    def acquire_lease(self) -> None:
        """Take the fenced lease: at once when the advisory lock is ours, else once the holder's lease expires."""
        assert self.lock_conn is not None
        deadline = time.monotonic() + self.cfg.lease_ttl_s + 5
        while True:
            generation = lease_acquire(self.lock_conn, self.holder, self.cfg.lease_ttl_s,
                                       steal=not self.cfg.database_pooled)
            if generation is not None:
                self.lease_generation = generation
                return
            if time.monotonic() > deadline or self.stop_event.is_set():
                raise SystemExit(self._die(EXIT_LOCKED, "another agent-host holds the single-writer lease of "
                                                        f"schema {self.cfg.schema} and keeps renewing it"))
            log.info("waiting for the previous host's lease to expire", extra={"event": "lease_wait"})
            self.stop_event.wait(0.5)

    def _die(self, code: int, message: str) -> int:
        log.error(message, extra={"event": "host_refused", "exit_code": code})
        print(f"agent-host: {message}", file=sys.stderr, flush=True)
        return code

    def read_back_state(self, rt: Runtime) -> dict[str, Any]:
        """Everything the host must know before acting; blocks what cannot be resumed safely."""
        t0 = time.perf_counter()
        summary: dict[str, Any] = {"resolved_effects": 0, "blocked_effects": 0}
        assert self.agents is not None
        summary["unblocked_tasks"] = (task_store.unblock_known_kinds(rt.conn, sorted(self.agents.agents))
                                      + task_store.unblock_loadable_releases(rt.conn, loadable_digests(self.cfg)))
        # Runs rolled back while a killed host was still in their step: their working files are discarded work.
        summary["discarded_workdirs"] = discard_rolled_back_workdirs(rt)
        kinds = {t.id: t.kind for t in task_store.unfinished(rt.conn)}
        for rec in rt.ledger.open_effects():
            if rec.state == "blocked":
                # The journal is evidence: an outcome it holds needs no human (a kill between its write and the
                # table's); the others wait for one.
                if rt.ledger.settle_from_journal(rec).state != "blocked":
                    summary["resolved_effects"] += 1
                continue
            agent = self.agents.agents.get(kinds.get(rec.task_id, ""))
            try:
                # The providers its task was built with: its recorded configuration may name its own.
                effects = rt.effects_for(agent, task_store.config_recorded(rt.conn, rec.task_id)) if agent else {}
            except ConfigError:
                effects = {}  # the step blocks the task, naming the spec
            adapter = effects.get(rec.effect)
            if adapter is None:
                continue  # unconfigured ones are reported by the step
            try:
                rt.ledger.resolve(rec, adapter)
                summary["resolved_effects"] += 1
            except TaskBlocked as exc:
                task_store.set_status(rt.conn, rec.task_id, "blocked", exc.reason, exc.detail)
                summary["blocked_effects"] += 1
            except (EffectInDoubt, EffectFailed, CorruptState, CredentialUnavailable) as exc:
                # The step's replay decides (a missing credential blocks the task there, naming it).
                log.warning("in-doubt effect not resolved at boot", extra={
                    "event": "in_doubt_unresolved", "idem_key": rec.idem_key, "error": str(exc)[:300]})
        unfinished = task_store.unfinished(rt.conn)
        resumable = []
        for task in unfinished:
            try:
                cp = rt.checkpoints.latest(task.id)
                rt.checkpoints.case_file(cp)
            except (CorruptState, SchemaTooNew) as exc:
                task_store.set_status(rt.conn, task.id, "blocked",
                                      "corrupt_state" if isinstance(exc, CorruptState) else "schema_too_new",
                                      str(exc))
                log.error("checkpoint unreadable; task blocked", extra={"event": "checkpoint_refused",
                                                                       "task_id": str(task.id), "error": str(exc)})
                continue
            resumable.append({"task": str(task.id), "checkpoint": cp.id if cp else None,
                              "step": cp.step if cp else None})
        try:
            window = rt.memory.window(self.cfg.memory_token_budget)
            summary["memory"] = {"messages": len(window.messages), "tokens": window.tokens,
                                 "rows_scanned": window.rows_scanned,
                                 "summary_upto": window.summary.upto_seq if window.summary else None}
        except CorruptState as exc:
            summary["memory"] = {"error": str(exc)}
            log.error("memory window unreadable", extra={"event": "memory_corrupt", "error": str(exc)})
        try:
            from agent_runtime.state.semantic import SemanticIndex, embedder_from_name

            summary["semantic"] = SemanticIndex(rt.conn, rt.store, embedder_from_name(self.cfg.embedder)).boot()
        except RuntimeStateError as exc:
            summary["semantic"] = {"error": str(exc)}
        summary["resumable"] = resumable
        summary["read_back_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return summary

    # --- threads -----------------------------------------------------------------------------
    def recheck_credentials(self, rt: Runtime) -> int:
        """Once per heartbeat interval: resume the tasks blocked on a credential the source now holds, or on a
        connected account the customer has connected again.

        The host asks the source of truth itself (the vault, through the control plane) rather than being told:
        the vault needs to know nothing of instances, and a credential stored while the instance slept or the
        control plane's call was lost is still found. One request per missing credential name, not per task."""
        now = time.monotonic()
        if now - self._credentials_checked_at < self.cfg.heartbeat_interval_s:
            return 0
        self._credentials_checked_at = now
        resumed = 0
        waiting = task_store.blocked_waiting(rt.conn)
        for name in waiting.get("credential_unavailable", []):
            if not rt.credentials.available(name):
                continue
            count = task_store.resume_credential(rt.conn, name)
            resumed += count
            log.info("credential available again; tasks resumed", extra={
                "event": "credential_tasks_resumed", "credential": name, "tasks": count})
        # The same for connected accounts: the customer connected again (HEAD, no token fetched or refreshed). Per
        # task: an end user's task waits for that end user's connection, which only the control plane can name.
        if waiting.get("connection_needs_reauth"):
            for task_id, provider in task_store.blocked_connection_tasks(rt.conn):
                if not rt.connections.available(provider, task_id=str(task_id)):
                    continue
                count = task_store.resume_connection_task(rt.conn, task_id, provider)
                resumed += count
                log.info("connection usable again; task resumed", extra={
                    "event": "connection_tasks_resumed", "provider": provider, "tasks": count})
        return resumed

    def work(self, rt: Runtime) -> None:
        assert self.agents is not None
        while not self.stop_event.is_set():
            try:
                if self._poll_started_at is None:  # a failed poll stays under way until one completes
                    self._poll_started_at = time.monotonic()
                self.recheck_credentials(rt)
                unfinished = task_store.unfinished(rt.conn)
                self._poll_done_at, self._poll_started_at = time.monotonic(), None
                now = self._poll_done_at
                pending = [t for t in unfinished if self._backoff.get(str(t.id), (0, 0.0))[1] <= now]
                if not pending:
                    self.progress.idle()
                    if self._wake.wait(self.idle_wait_s(unfinished, now)):
                        self._wake.clear()
                    continue
                for task in pending:
                    if self.stop_event.is_set():
                        break
                    agent = self.agents.agents.get(task.kind)
                    placement = place(rt.conn, task.id, agent, self.cfg)
                    if isinstance(placement, Unavailable):
                        task_store.set_status(rt.conn, task.id, "blocked", "release_unavailable", placement.detail)
                        continue
                    if isinstance(placement, Pinned):
                        outcome = run_pinned(self.cfg, self.holder, task.id, placement.release,
                                             stop=self.stop_event, cancelled=rt.cancelled)
                    elif agent is None:
                        task_store.set_status(rt.conn, task.id, "blocked", "unknown_kind",
                                              f"this instance runs {sorted(self.agents.agents)}, not {task.kind!r}")
                        continue
                    else:
                        outcome = run_task(rt, agent, task.id)
                    log.info("task outcome", extra={"event": "task_outcome", "task_id": str(task.id),
                                                    "outcome": outcome})
                    self._note_outcome(str(task.id), outcome)
                    if agent is not None:
                        self.memory_upkeep(rt, agent)
            except psycopg.Error as exc:
                if is_fence_error(exc):  # another host holds the lease: not one more write from this one
                    self.lock_lost = "single-writer lock lost: a write was fenced off (another host holds the lease)"
                    log.error(self.lock_lost, extra={"event": "lock_lost"})
                    self._request_stop()
                    return
                if not isinstance(exc, psycopg.OperationalError):
                    raise
                log.error("database unavailable; retrying", extra={"event": "db_error", "error": str(exc)})
                self.stop_event.wait(1.0)
                if self.cfg.database_pooled and not reusable(rt.conn):
                    # The pooler (or the server behind it) dropped this client connection: through a pooler the
                    # connection holds nothing (no lock, no session state), so a new one continues the work; the
                    # fence still refuses its writes if another host took the lease meanwhile.
                    try:
                        rt.rebind(self._reopen(rt.conn))
                        log.info("reconnected to the pooler", extra={"event": "db_reconnected", "conn": "worker"})
                    except psycopg.Error as again:
                        log.warning("pooler still unreachable", extra={"event": "db_error", "error": str(again)})

    def idle_wait_s(self, unfinished: list[task_store.Task], now: float) -> float:
        """How long an idle worker waits before it looks again, unless woken (``wake_worker``).

        Through a transaction pooler there is no LISTEN: every poll interval, as ever. On a direct connection the
        lease's session LISTENs for new tasks (``db_probe_loop``) and the instance API wakes the worker itself, so
        the look that is left is a cheap one at the heartbeat's pace: it re-checks blocked credentials (already
        paced so), notices a task made runnable by a write that sends no notification, and keeps /healthz's proof
        that the worker's own poll completes. A task waiting out its backoff is looked at when that ends."""
        if not self._listening:
            return self.cfg.poll_interval_s
        wait = max(self.cfg.poll_interval_s, self.cfg.heartbeat_interval_s)
        for task in unfinished:
            until = self._backoff.get(str(task.id), (0, 0.0))[1]
            if until > now:
                wait = min(wait, until - now)
        return max(0.0, wait)

    def _work_guarded(self, rt: Runtime) -> None:
        """The worker thread: an exception that escapes the task loop is a crash, never a clean stop."""
        try:
            self.work(rt)
        except BaseException as exc:
            self.worker_error = f"{type(exc).__name__}: {exc}"
            log.exception("worker died", extra={"event": "worker_died", "error": self.worker_error[:500]})
        finally:
            self._attention.set()

    def db_probe_loop(self) -> None:
        """Every heartbeat interval, prove the database answers and that this host still holds its lock.

        Direct connections: the lock's session is the single-writer guarantee: if it ended (terminated, server
        restarted, partition), another host may start, so this one stops at once instead of writing beside it.
        Pooled (``AGENT_DATABASE_POOLED``): the lease alone is; a dropped connection is reopened and the next
        renewal decides (it fails only when another host took the lease over).
        """
        assert self.lock_conn is not None
        while not self._wait_for_notifications(self.cfg.heartbeat_interval_s):
            try:
                reason = "single-writer lock lost: another host took over the lease"
                if self.cfg.database_pooled:
                    held = lease_renew(self.lock_conn, self.holder, self.cfg.lease_ttl_s)
                else:
                    check = time.monotonic() - self._lock_checked_at >= LOCK_CHECK_S
                    holding = lease_renew_holding_lock(self.lock_conn, self.holder, self.cfg.lease_ttl_s,
                                                       check_lock=check)
                    if check:
                        self._lock_checked_at = time.monotonic()
                    held = bool(holding)
                    if holding is False:
                        reason = "single-writer lock lost: the session no longer holds it"
            except psycopg.Error as exc:
                if self.cfg.database_pooled and not is_fence_error(exc):
                    # Pooled: the lease row, not this connection, is the lock. A dropped connection (pooler or
                    # server restarted) is reopened; the next renewal says whether the lease is still ours (it
                    # is unless another host took it over after it expired, and then that host's fence holds).
                    log.warning("lease renewal failed; reconnecting", extra={"event": "db_error", "error": str(exc)})
                    if not reusable(self.lock_conn):
                        try:
                            self.lock_conn = self._reopen(self.lock_conn)
                            log.info("reconnected to the pooler", extra={"event": "db_reconnected", "conn": "lease"})
                        except psycopg.Error:
                            pass
                    continue
                held, reason = False, f"single-writer lock lost: its database session ended ({type(exc).__name__})"
            if not held:
                self.lock_lost = reason
                log.error(reason, extra={"event": "lock_lost"})
                self._request_stop()
                return
            self._db_ok_at = time.monotonic()

    def listen_for_tasks(self) -> None:
        """Direct connections: the lease's session LISTENs on the tenant's own tasks' channel (``tasks.submit``
        notifies it with an empty payload; its random name is read from the schema once, here), so a task submitted
        by another process wakes the idle worker at once instead of at its next look. Pooled: a LISTEN would pin a
        server session (tests/runtime/test_pooled_sessions.py), so the worker polls as before."""
        if self.cfg.database_pooled or self.lock_conn is None:
            return
        channel = task_store.notify_channel(self.lock_conn)
        self.lock_conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self._listening = True

    def _wait_for_notifications(self, seconds: float) -> bool:
        """Sleep ``seconds`` (True: the host is stopping), passing on task notifications as they come.

        A blocking read of the lease session's socket and of the stop pipe, nothing else: psycopg's own
        ``notifies(timeout=...)`` wakes every 0.1 s (to notice a Ctrl-C), which is most of an idle host's CPU.
        Notifications that arrived during the renewal's query wait in psycopg's backlog and are drained here too."""
        if not self._listening:
            return self.stop_event.wait(seconds)
        assert self.lock_conn is not None
        deadline = time.monotonic() + seconds
        while not self.stop_event.is_set():
            try:
                if any(True for _ in self.lock_conn.notifies(timeout=0)):
                    self.wake_worker()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                select.select([self.lock_conn.fileno(), self._stop_r], [], [], left)
            except (psycopg.Error, OSError, ValueError):
                return self.stop_event.wait(max(0.0, deadline - time.monotonic()))  # the renewal says why
        return True

    def memory_upkeep(self, rt: Runtime, agent: Any) -> None:
        """After each task run: fold the threads it wrote to that outgrew the window (`memory_upkeep`)."""
        summarize = getattr(agent, "summarize", None) or extractive_summary
        try:
            self._memory_seq, rolled = roll_over_threads(rt.conn, self.cfg.memory_token_budget, summarize,
                                                         self._memory_seq)
        except Exception as exc:  # a summarizer's failure must not stop the worker; the log is intact
            log.warning("memory rollover failed", extra={"event": "memory_rollover_failed", "error": repr(exc)})
            return
        if rolled:
            log.info("threads rolled over", extra={"event": "memory_rollover", "threads": rolled})

    def _note_outcome(self, task_id: str, outcome: str) -> None:
        """A task that must try again (an effect in doubt, a failed step) waits, doubling up to the cap."""
        if outcome != "retry":
            self._backoff.pop(task_id, None)
            return
        tries = self._backoff.get(task_id, (0, 0.0))[0] + 1
        delay = min(self.cfg.effect_retry_max_s, 0.2 * 2 ** (tries - 1))
        self._backoff[task_id] = (tries, time.monotonic() + delay)

    def heartbeat_loop(self) -> None:
        url, token = self.cfg.control_plane_url, self.cfg.instance_token
        if not (url and token):
            return
        while not self.stop_event.wait(self.cfg.heartbeat_interval_s):
            self.send_heartbeat(url, token)

    def send_heartbeat(self, url: str, token: str, status: str | None = None) -> None:
        v = self.progress.view()
        body: dict[str, Any] = {"task": v.task, "step": v.step, "checkpoint": v.checkpoint,
                                "progress_seq": v.progress_seq,
                                "status": status or (v.status if self.healthy()[0] else "stalled")}
        if self.load_error:
            body["error"] = self.load_error[:500]
        if self._beats is None:
            self._beats = KeptAlivePoster(url, token, "/internal/v1/heartbeat", timeout_s=2.0)
        try:
            status_code = self._beats.post(body)
        except Exception as exc:
            log.warning("heartbeat failed", extra={"event": "heartbeat_failed", "error": type(exc).__name__})
            return
        if status_code >= 400:
            log.warning("heartbeat failed", extra={"event": "heartbeat_failed", "error": f"HTTP {status_code}"})

    @property
    def poll_bound_s(self) -> float:
        """How long the worker's poll for tasks may take before /healthz says the database stalls it: the same
        allowance as for the lease renewal, plus one poll interval."""
        return max(5.0, self.cfg.poll_interval_s + 3 * self.cfg.heartbeat_interval_s)

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        v = self.progress.view()
        info = {"task": v.task, "step": v.step, "checkpoint": v.checkpoint, "progress_seq": v.progress_seq,
                "busy": v.busy, "seconds_since_progress": round(v.seconds_since_advance, 2)}
        if self.lock_lost:
            return False, {**info, "reason": self.lock_lost}
        if self.worker is not None and not self.worker.is_alive() and not self.stop_event.is_set():
            return False, {**info, "reason": f"worker thread died: {self.worker_error or 'unknown'}"}
        db_silence = time.monotonic() - self._db_ok_at
        if db_silence > max(5.0, 3 * self.cfg.heartbeat_interval_s):
            return False, {**info, "reason": f"database has not answered for {db_silence:.0f}s"}
        poll_started = self._poll_started_at
        if poll_started is not None:  # outside a step: the worker polls for tasks on its own connection
            polling = time.monotonic() - poll_started
            if polling > self.poll_bound_s:
                return False, {**info, "reason": f"database: the worker's poll for tasks has not completed for "
                                                 f"{polling:.1f}s (last completed "
                                                 f"{time.monotonic() - self._poll_done_at:.1f}s ago)"}
        timeout = v.step_timeout_s or self.cfg.step_timeout_s
        if v.busy and v.seconds_since_advance > timeout:
            return False, {**info, "reason": f"no progress for more than {timeout}s"}
        return True, info

    def serve_http(self) -> HostHTTPServer:
        host = self
        api = InstanceAPI(self)

        keepalive_s = self.cfg.http_keepalive_s

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: the control plane keeps its connection for the next call (instances.client), which saves
            # it the connect and this server a thread per request (issue 39: ~0.8 ms a call on a slow VM). Every
            # answer has a Content-Length; an event stream says ``Connection: close`` (api._Stream). The
            # headers and the body are two writes: NODELAY keeps Nagle from holding the body back.
            protocol_version = "HTTP/1.1" if keepalive_s > 0 else "HTTP/1.0"
            disable_nagle_algorithm = True
            served = 0

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def handle_one_request(self) -> None:
                if self.served:  # a kept-alive connection waits this long for its next request, then closes
                    self.connection.settimeout(keepalive_s)
                self.served += 1
                super().handle_one_request()

            def parse_request(self) -> bool:
                self.connection.settimeout(None)  # the request line came: the rest has no idle limit
                if not super().parse_request():
                    return False
                if self.served > 1 and host.stop_event.is_set():
                    # Stopping: a kept-alive connection takes no new request (a new connection would find the
                    # listening socket closed); 503, so the control plane keeps the item and delivers it again.
                    self.close_connection = True
                    api.problem(self, ApiError(503, "not_ready", "the instance is stopping", {"Retry-After": "1"}))
                    return False
                return True

            def _api(self) -> bool:
                if self.path.startswith("/v1/"):
                    api.handle(self, self.command)  # reads the whole body first, whatever it answers
                    return True
                body = self.headers.get("Content-Length", "0").strip() not in ("", "0")
                if body or "Transfer-Encoding" in self.headers:
                    self.close_connection = True  # a body here is never read: the connection cannot carry another
                return False

            def do_POST(self) -> None:  # noqa: N802
                if not self._api():
                    self._send(404, {"error": "not found"})

            do_PUT = do_PATCH = do_DELETE = do_POST  # noqa: N815 - the API answers 405 (after checking the signature)

            def do_GET(self) -> None:  # noqa: N802
                if self._api():
                    return
                if self.path == "/healthz":
                    ok, info = host.healthy()
                    self._send(200 if ok else 503, {"healthy": ok, **info})
                elif self.path == "/readyz":
                    ready = host.ready.is_set() and not host.stop_event.is_set()
                    body: dict[str, Any] = {"ready": ready, "read_back": host.read_back,
                                            "agents": host.agents.describe() if host.agents else [],
                                            "release": host.cfg.release}
                    if host.load_error:
                        body["error"] = host.load_error
                    self._send(200 if ready else 503, body)
                else:
                    self._send(404, {"error": "not found"})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

        server = HostHTTPServer((self.cfg.http_host, self.cfg.http_port), Handler)
        threading.Thread(target=server.serve_until_shutdown, daemon=True, name="http").start()
        _write_atomic(self.cfg.host_dir / "http-port", str(server.server_address[1]))
        return server

    # --- life cycle --------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        # First thing: a stop that arrives while booting is a planned stop too (stop at the first boundary).
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        cfg.host_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg.workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
        # In a network namespace of its own: the granted HTTP destinations at loopback, before anything calls them.
        start_forwards(cfg.net_forwards)
        self.acquire_single_writer_lock()
        assert self.lock_conn is not None
        _write_atomic(cfg.host_dir / "pid", str(os.getpid()))
        server = self.serve_http()
        # Migrations run before the lease exists (its table is one of them): on a connection the fence ignores.
        with connect(cfg.database_url, cfg.schema, autocommit=True, application_name="agent-host-migrate",
                     pooled=cfg.database_pooled) as mc:
            try:
                version = migrate(mc, cfg.schema)
            except SchemaTooNew as exc:
                return self._die(EXIT_SCHEMA, str(exc))
        self.acquire_lease()
        conn = connect(cfg.database_url, cfg.schema, autocommit=True, application_name=self.application_name,
                       pooled=cfg.database_pooled)
        rt = self.build_runtime(conn)
        if not self.load_agents():
            # Up and not ready, saying why; nothing runs until a fixed package is installed and the host restarts.
            _write_atomic(cfg.host_dir / "status", json.dumps({"state": "agent_load_failed", "pid": os.getpid()}))
            heartbeats = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
            heartbeats.start()
            self.stop_event.wait()
            server.shutdown()
            return 0
        self.read_back = {"schema_version": version, **self.read_back_state(rt)}
        # Memory upkeep looks at threads that get messages from now on; not every thread of the log at the first
        # task after each boot (a thread only outgrows its window by receiving messages, which brings it back).
        row = conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()
        self._memory_seq = int(row[0]) if row else 0
        # The release it booted with, so the control plane can verify what an instance runs (null: the runtime's).
        conn.execute("INSERT INTO host_events (kind, detail) VALUES ('boot', %s)",
                     (Jsonb({"pid": os.getpid(), **self.read_back, "release": self.cfg.release}),))
        log.info("read-back done; ready", extra={"event": "ready", **self.read_back})
        # The read-back touched every table of the schema: the server process behind this connection now caches
        # their catalog entries (a few MiB), which an idle worker's look for tasks does not need. A fresh session
        # caches what the next task uses, no more.
        rt.rebind(connect(cfg.database_url, cfg.schema, autocommit=True, application_name=self.application_name,
                          pooled=cfg.database_pooled))
        conn.close()
        self.runtime = rt
        self.ready.set()
        _write_atomic(cfg.host_dir / "status", json.dumps({"state": "ready", "pid": os.getpid()}))
        self.listen_for_tasks()
        self.worker = threading.Thread(target=self._work_guarded, args=(rt,), name="worker", daemon=True)
        self.worker.start()
        threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True).start()
        self.db_probe = threading.Thread(target=self.db_probe_loop, name="db-probe", daemon=True)
        self.db_probe.start()
        release_boot_memory()
        # Woken by a stop (`_request_stop`, from the signal handlers too) or by the worker's end, not by a 0.1 s timer:
        # an idle host should not be scheduled ten times a second for nothing.
        while not self.stop_event.is_set() and self.worker.is_alive():
            self._attention.wait(cfg.heartbeat_interval_s)  # (a signal's handler runs during the wait)
            self._attention.clear()
        if self.lock_lost or self.worker_error is not None or not self.stop_event.is_set():
            return self.crash(server)
        return self.shutdown(server)

    def crash(self, server: ThreadingHTTPServer) -> int:
        """Lost the lock or the worker died: say so, exit non-zero, write nothing that claims a clean stop."""
        code = EXIT_LOCK_LOST if self.lock_lost else EXIT_WORKER_DIED
        reason = self.lock_lost or f"worker died: {self.worker_error or 'unknown'}"
        if not self.lock_lost:
            try:
                assert self.lock_conn is not None
                self._records_durable()
                self.lock_conn.execute("INSERT INTO host_events (kind, detail) VALUES ('crash', %s)",
                                       (Jsonb({"pid": os.getpid(), "reason": reason[:1000]}),))
            except psycopg.Error:
                pass
        _write_atomic(self.cfg.host_dir / "status", json.dumps({"state": "crashed", "reason": reason[:500]}))
        print(f"agent-host: {reason}", file=sys.stderr, flush=True)
        server.shutdown()
        logging.shutdown()
        os._exit(code)  # the worker may be stuck inside a step; nothing of an unfinished step is committed

    def shutdown(self, server: ThreadingHTTPServer) -> int:
        t0 = time.monotonic()
        assert self.worker is not None and self.lock_conn is not None
        self._request_stop()
        self.worker.join(timeout=max(0.0, self.cfg.grace_period_s - STOP_RESERVE_S))
        view = self.progress.view()
        abandoned = self.worker.is_alive()
        self._records_durable()
        if abandoned and view.task and view.step:
            # The step could not finish in the grace period: it stays un-done and re-runs on next boot. A step
            # that had stopped making progress is 'hung' (counts as an attempt); otherwise our own stop
            # interrupted it ('abandoned': not the step's fault, never counted against it).
            event = "hung" if view.seconds_since_advance > (view.step_timeout_s or self.cfg.step_timeout_s) \
                else "abandoned"
            self.lock_conn.execute("INSERT INTO step_events (task_id, step, event) VALUES (%s, %s, %s)",
                                   (view.task, view.step, event))
        detail = {"pid": os.getpid(), "abandoned_step": view.step if abandoned else None, "task": view.task,
                  "seconds": round(time.monotonic() - t0, 3)}
        self.lock_conn.execute("INSERT INTO host_events (kind, detail) VALUES ('clean_shutdown', %s)",
                               (Jsonb(detail),))
        try:  # the next host (a restart, a wake, a release switch) need not wait out the TTL in pooled mode
            if self.db_probe is not None:
                self.db_probe.join(timeout=2)  # a renewal under way would extend the lease again
            lease_release(self.lock_conn, self.holder)
        except psycopg.Error as exc:
            log.warning("lease not released", extra={"event": "lease_release_failed", "error": str(exc)[:300]})
        if self.cfg.control_plane_url and self.cfg.instance_token:
            self.send_heartbeat(self.cfg.control_plane_url, self.cfg.instance_token, status="stopped")
        _write_atomic(self.cfg.host_dir / "status", json.dumps({"state": "stopped", **detail}))
        log.info("clean shutdown", extra={"event": "clean_shutdown", **detail})
        server.shutdown()
        logging.shutdown()
        if abandoned:
            os._exit(0)  # the worker thread is stuck inside the step; nothing of it is committed
        return 0
