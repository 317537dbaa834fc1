"""The step machinery: run a task's remaining steps, checkpointing after each one.

A run of a task is one OpenTelemetry trace (`host.tracing`): an `invoke_agent` span, and for each step: record
'start', run it inside a `step` span, then commit in ONE transaction the case-file delta, the checkpoint
(workspace digest, effect-ledger position) and the 'done' event (for the last step, also the task's status
'done'); the span gets the checkpoint id. The finished spans are written to the schema at each step boundary.
Completed steps (in the case file) are never run again. Before resuming, the workspace digest is compared with
the checkpoint: a mismatch not explained by an interrupted step is refused (task blocked) or forked explicitly,
never silently mixed.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from agent_runtime.codec import unstorable
from agent_runtime.effects.config import adapters_from_config
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import EffectLedger
from agent_runtime.errors import (
    ConfigError,
    ConnectionUnavailable,
    CorruptState,
    CredentialUnavailable,
    EffectFailed,
    EffectInDoubt,
    EffectKeyConflict,
    JudgmentInvalid,
    RestoreRefused,
    RuntimeStateError,
    SchemaTooNew,
    SnapshotMissing,
    TaskBlocked,
    WorkspaceRefused,
)
from agent_runtime.host.agent_config import ConfigSource, ConfigUnavailable
from agent_runtime.host.connections import ConnectionSource, EnvConnectionSource
from agent_runtime.host.credentials import CredentialSource
from agent_runtime.host.progress import ProgressMarker
from agent_runtime.host.streams import StreamHub
from agent_runtime.host.tracing import TASK_ATTRIBUTE, TASK_SPANS, content, content_enabled
from agent_runtime.mcp.config import McpServerSpec
from agent_runtime.sdk.agent import AgentDefinition, Step
from agent_runtime.sdk.context import Context
from agent_runtime.sdk.context import task_workdir as _task_workdir
from agent_runtime.state import tasks as task_store
from agent_runtime.state.checkpoints import CaseDelta, CaseFile, Checkpoint, CheckpointStore
from agent_runtime.state.fence import is_fence_error
from agent_runtime.state.judgments import JudgmentStore
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.objectstore import ObjectStore
from agent_runtime.state.toolcache import ToolCache
from agent_runtime.state.traces import spans_prune, spans_write
from agent_runtime.state.workspace import tree_digest

__all__ = ["Runtime", "Step", "discard_rolled_back_workdirs", "run_task", "restore_checkpoint", "step_error",
           "task_workdir"]

log = logging.getLogger("agent_runtime.host.runner")


@dataclass
class Runtime:
    """Everything a task needs, built once by the host (or a test) from the tenant's resources."""

    conn: psycopg.Connection
    tenant_id: str
    volume: Path
    store: ObjectStore
    credentials: CredentialSource
    effects: dict[str, Any] = field(default_factory=dict)
    # The instance's MCP servers (AGENT_MCP_SERVERS); a task's configuration may name its own under `mcp`.
    mcp_servers: dict[str, McpServerSpec] = field(default_factory=dict)
    # The instance's static configuration (AGENT_CONFIG); with a config_source, each task asks that instead.
    agent_config: dict[str, Any] = field(default_factory=dict)
    config_source: ConfigSource | None = None
    progress: ProgressMarker = field(default_factory=ProgressMarker)
    # The customer's connected accounts (ctx.connections): the control plane's delivery, else the environment's.
    connections: ConnectionSource = field(default_factory=EnvConnectionSource)
    # Where `ctx.schedule` makes the agent's schedules (an effect adapter: the control plane's); None without one.
    schedules: Any = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    on_workspace_mismatch: str = "refuse"
    checkpoint_interval_s: float = 5.0
    keep_latest: int = 5
    step_max_attempts: int = 3
    tool_ttl_s: dict[str, float | None] = field(default_factory=dict)
    # Traces kept in the schema (`state.traces`): spans per task, and days before they are pruned.
    trace_spans_per_task: int = 500
    trace_keep_days: float = 30.0
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer("agent_runtime"))
    # Ids of tasks the instance API cancelled while this host runs (the row says so too; this saves the worker a
    # query before every step). Chunks steps stream with ctx.stream go to `streams`.
    cancelled: set[str] = field(default_factory=set)
    # Runs a new message's thread policy ended ('interrupted' / 'rolled_back', by task id): stopped, like a
    # cancel, at the next step boundary.
    halted: dict[str, str] = field(default_factory=dict)
    streams: StreamHub = field(default_factory=StreamHub)

    def __post_init__(self) -> None:
        self.checkpoints = CheckpointStore(self.conn, keep_latest=self.keep_latest)
        self.ledger = EffectLedger(self.conn, self.tenant_id, EffectJournal(self.store))
        self.judgments = JudgmentStore(self.conn)
        self.tool_cache = ToolCache(self.conn, self.store, ttl_s=self.tool_ttl_s)
        self.memory = MemoryStore(self.conn)
        self._agent_effects: dict[str, dict[str, Any]] = {}
        self._traces_pruned_at = getattr(self, "_traces_pruned_at", 0.0)

    def rebind(self, conn: psycopg.Connection) -> None:
        """Continue on `conn` in place of a dropped connection (pooled mode: a pooler or server restart); every
        store follows. The stores keep no state of their own beyond the connection, so nothing else is lost."""
        agent_effects = self._agent_effects
        self.conn = conn
        self.__post_init__()
        self._agent_effects = agent_effects

    @property
    def workspace(self) -> Path:
        return self.volume / "workspace"

    def config_fetch(self) -> dict[str, Any]:
        """The configuration a task starting now gets (ConfigUnavailable: not now, the task retries later).

        The instance's AGENT_CONFIG is the base (an instance-wide setting such as INSTANCE_EXTRA_ENV's keeps
        working); the source's answer, the customer's effective configuration, wins key by key."""
        if self.config_source is None:
            return dict(self.agent_config)
        return {**self.agent_config, **self.config_source.fetch()}

    def effects_for(self, agent: AgentDefinition, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The providers a task of `agent` with agent configuration `config` gets. Lowest first, each replacing
        the one below by name: the instance's (AGENT_EFFECTS and its shortcuts), those the task's configuration
        names under `effects` (the customer's, issue 32), those the agent package brings (code, built once per
        kind). ConfigError when the configuration's `effects` is not a valid set of specs."""
        configured = adapters_from_config(config or {}, self.credentials)
        own = getattr(agent, "effects", None)
        if not own:
            return {**self.effects, **configured} if configured else self.effects
        if agent.kind not in self._agent_effects:
            self._agent_effects[agent.kind] = {
                name: (spec(self.agent_config, self.credentials)
                       if isinstance(spec, type) or not hasattr(spec, "perform") else spec)
                for name, spec in own.items()}
        return {**self.effects, **configured, **self._agent_effects[agent.kind]}


def task_workdir(rt: Runtime, task_id: UUID) -> Path:
    return _task_workdir(rt.workspace, task_id)


def _last_step_event(conn: psycopg.Connection, task_id: UUID) -> tuple[str, str] | None:
    row = conn.execute(
        "SELECT step, event FROM step_events WHERE task_id = %s ORDER BY id DESC LIMIT 1", (task_id,)
    ).fetchone()
    return (row[0], row[1]) if row else None


def _step_event(conn: psycopg.Connection, task_id: UUID, step: str, event: str, error: str | None = None) -> None:
    conn.execute("INSERT INTO step_events (task_id, step, event, error) VALUES (%s, %s, %s, %s)",
                 (task_id, step, event, error[:2000] if error else None))


def _package_root(fn: Any) -> Path | None:
    """The directory holding the top-level package of the module that defines `fn` (the agent's own code)."""
    top = sys.modules.get((getattr(fn, "__module__", None) or "").split(".")[0])
    path = getattr(top, "__file__", None)
    if not path:
        return None
    where = Path(path).resolve().parent
    # A package's __init__.py sits in the package; a single-module agent sits next to its siblings.
    return where.parent if Path(path).name == "__init__.py" else where


def step_error(exc: BaseException, fn: Any) -> str:
    """`Type: message (package/file.py:LINE in function)` at the innermost frame of the agent's own code (where
    the author can act), not the runtime's or a library's; the path is relative to the agent's package, so no
    host path leaves the instance."""
    root = _package_root(fn)
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        if root is not None and path.is_relative_to(root):
            where = f" ({path.relative_to(root).as_posix()}:{frame.lineno} in {frame.name})"
            break
    if not where:  # no frame of the agent's package (a lambda, a wrapped callable): the innermost non-runtime one
        runtime = Path(__file__).resolve().parents[1]
        for frame in reversed(frames):
            path = Path(frame.filename).resolve()
            if not path.is_relative_to(runtime):
                where = f" ({path.name}:{frame.lineno} in {frame.name})"
                break
    message = str(exc)
    return f"{type(exc).__name__}: {message[:1000]}{where}" if message else f"{type(exc).__name__}{where}"


def _start_attempt(conn: psycopg.Connection, task_id: UUID, step: str, max_attempts: int
                   ) -> tuple[bool, int, list[str]]:
    """Record the step's 'start' unless its attempts are used up, in one round trip; return (started,
    attempts before this one, the step's event history).

    Attempts that count against a step: every start since the task's last retry, except those our own shutdown
    abandoned and those that waited (an effect in doubt, a credential the vault did not hold).

    'start' commits without waiting for the WAL flush (`task_store.ASYNC_COMMIT`): a host killed after it finds
    it committed all the same (only a PostgreSQL or OS crash can lose it, and then the step's attempt goes
    uncounted), and the step's first effect intent or its checkpoint, synchronous commits on this connection,
    flush it before anything irreversible or final happens (docs/runtime.md).
    """
    row = conn.execute(
        "WITH prior AS (SELECT id, event FROM step_events WHERE task_id = %s AND step = %s AND id > coalesce("  # noqa: S608
        " (SELECT max(id) FROM step_events WHERE task_id = %s AND event = 'retried'), 0)),"
        " counted AS (SELECT count(*) FILTER (WHERE event = 'start') - count(*) FILTER (WHERE event IN"
        " ('abandoned', 'waiting')) AS n FROM prior),"
        " ins AS (INSERT INTO step_events (task_id, step, event) SELECT %s, %s, 'start' FROM counted"
        " WHERE n < %s RETURNING id)"
        " SELECT (SELECT n FROM counted), (SELECT coalesce(array_agg(event ORDER BY id), '{}') FROM prior),"
        f" EXISTS (SELECT 1 FROM ins), {task_store.async_commit(conn)}",
        (task_id, step, task_id, task_id, step, max_attempts)).fetchone()
    assert row is not None
    return bool(row[2]), int(row[0]), list(row[1])


def _block(rt: Runtime, task_id: UUID, reason: str, detail: str, credential: str | None = None) -> str:
    task_store.set_status(rt.conn, task_id, "blocked", reason, detail[:2000], credential=credential)
    log.warning("task blocked", extra={"event": "task_blocked", "task_id": str(task_id), "reason": reason,
                                        "detail": detail[:500]})
    return "blocked"


def _blocked_reason(exc: Exception) -> str:
    reasons: dict[type[Exception], str] = {
        JudgmentInvalid: "judgment_invalid", CredentialUnavailable: "credential_unavailable",
        EffectFailed: "effect_failed", CorruptState: "corrupt_state", SchemaTooNew: "schema_too_new",
        SnapshotMissing: "snapshot_missing", RestoreRefused: "restore_refused",
        EffectKeyConflict: "effect_key_conflict", WorkspaceRefused: "workspace_refused",
    }
    return reasons.get(type(exc), "runtime_error")


def _unstorable_delta(step: str, delta: CaseDelta) -> str | None:
    """Why the step's case-file delta (its result, notes, waits, ruled-out entries) cannot be stored, naming the
    entry, the type and the position, never the data; None when it can."""
    what = {"done": "its result", "note": "case-file note", "waiting": "wait", "ruled_out": "ruled-out entry"}
    for kind, key, value in delta.entries():
        entry = what[kind] if kind == "done" else f"{what[kind]} {ascii(key)[:80]}"
        problem = unstorable(key) if isinstance(key, str) else f"a key of type {type(key).__name__}"
        if problem is not None:
            return f"step {step!r}: {entry} cannot be stored: its name holds {problem}"
        if (problem := unstorable(value)) is not None:
            return f"step {step!r}: {entry} cannot be stored: {problem}"
    return None


_PRUNE_EVERY_S = 3600.0


def _spans_flush(rt: Runtime, task_id: UUID, *, prune: bool = False) -> None:
    """Write the task's finished spans to the schema (and, at most hourly, prune old ones). A trace is worth less
    than the task: a database error here is logged and the spans dropped, except a fence error (another host
    holds the lease), which must stop this worker as anywhere else."""
    rows = TASK_SPANS.take(str(task_id))
    try:
        spans_write(rt.conn, rows, max_per_task=rt.trace_spans_per_task)
        if prune and time.monotonic() - rt._traces_pruned_at > _PRUNE_EVERY_S:
            rt._traces_pruned_at = time.monotonic()
            spans_prune(rt.conn, older_than=datetime.now(UTC) - timedelta(days=rt.trace_keep_days))
    except (psycopg.Error, ValueError) as exc:  # ValueError: a value no JSON or text column can hold
        if isinstance(exc, psycopg.Error) and (is_fence_error(exc) or isinstance(exc, psycopg.OperationalError)):
            raise
        log.warning("spans not stored", extra={"event": "spans_not_stored", "task_id": str(task_id),
                                               "spans": len(rows), "error": str(exc)[:300]})


def run_task(rt: Runtime, agent: AgentDefinition, task_id: UUID) -> str:
    """Run the remaining steps of `task_id`; return 'done', 'blocked', 'stopped', 'retry' or 'failed'.

    The run is an `invoke_agent <kind>` span (GenAI conventions) whose trace holds every span of the run."""
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.kind,
                  TASK_ATTRIBUTE: str(task_id)}
    try:
        with rt.tracer.start_as_current_span(f"invoke_agent {agent.kind}", attributes=attributes) as span:
            outcome = _run_task(rt, agent, task_id)
            span.set_attribute("agent.outcome", outcome)
            if outcome in ("blocked", "failed"):
                span.set_status(Status(StatusCode.ERROR, outcome))
        return outcome
    finally:
        _spans_flush(rt, task_id, prune=True)


def _run_task(rt: Runtime, agent: AgentDefinition, task_id: UUID) -> str:
    run_start = task_store.start_run(rt.conn, task_id, with_checkpoint=True)
    if run_start is None:
        raise CorruptState(f"task {task_id} does not exist")
    task, recorded_config, latest_row = run_start
    if task.status in ("blocked", *task_store.ENDED):
        return task.status
    if isinstance(task.params.get("thread"), str):
        trace.get_current_span().set_attribute("gen_ai.conversation.id", task.params["thread"])
    if str(task.id) in rt.cancelled:
        return "cancelled"
    if (halted := _halted(rt, task.id)) is not None:
        return halted
    try:
        cp = rt.checkpoints.decode(latest_row) if latest_row is not None else None  # read by start_run
        case = rt.checkpoints.case_file(cp)
    except (CorruptState, SchemaTooNew) as exc:
        return _block(rt, task.id, _blocked_reason(exc), str(exc))
    workdir = task_workdir(rt, task.id)
    if cp is not None:
        try:
            current = tree_digest(workdir)
        except WorkspaceRefused as exc:
            return _block(rt, task.id, "workspace_refused", str(exc))
        if current != cp.workspace_digest:
            last = _last_step_event(rt.conn, task.id)
            if last is not None and last[1] != "done" and last[0] not in case.steps_done:
                # Partial writes of the interrupted step; that step re-runs and rewrites them.
                log.info("workspace dirty from interrupted step", extra={
                    "event": "workspace_dirty_interrupted", "task_id": str(task.id), "step": last[0]})
            elif rt.on_workspace_mismatch == "fork":
                with rt.conn.transaction():
                    cp = rt.checkpoints.fork_from(cp, new_branch=task.branch + 1, workspace_digest=current,
                                                  ledger_pos=rt.ledger.position(task.id),
                                                  reason="workspace digest differs from checkpoint at resume")
                task = task_store.get(rt.conn, task.id) or task
                case = rt.checkpoints.case_file(cp)
            else:
                return _block(rt, task.id, "workspace_mismatch",
                              f"workspace digest {current[:12]} differs from checkpoint {cp.id} "
                              f"({cp.workspace_digest[:12]}); refusing to resume")
    cp_seq = cp.seq if cp else 0
    try:
        config = task_store.config_record(rt.conn, task.id, rt.config_fetch, read=False, recorded=recorded_config)
    except ConfigUnavailable as exc:
        log.warning("agent configuration unavailable; the task waits", extra={
            "event": "config_unavailable", "task_id": str(task.id), "detail": str(exc)})
        return "retry"
    try:
        effects = rt.effects_for(agent, config)
    except ConfigError as exc:
        # Recorded with the task, so a retry would find the same specs: a human fixes the configuration.
        return _block(rt, task.id, "effects_config_invalid", str(exc))
    steps = agent.steps(task.params)
    finished = False
    for step in steps:
        if step.name in case.steps_done:
            continue
        _spans_flush(rt, task.id)  # the previous step's spans, at its boundary
        if rt.stop_event.is_set():
            return "stopped"
        if str(task.id) in rt.cancelled:  # the instance API cancelled it: no further step starts
            return "cancelled"
        if (halted := _halted(rt, task.id)) is not None:  # a new message's thread policy ended it
            return halted
        max_attempts = step.max_attempts or rt.step_max_attempts
        started, attempts, history = _start_attempt(rt.conn, task.id, step.name, max_attempts)
        if not started:
            # Crashes, kills and hangs leave no 'failed' row: counting starts is what catches a poison step.
            return _block(rt, task.id, "poison_step", f"step {step.name!r} was attempted {attempts} times "
                          f"(AGENT_STEP_MAX_ATTEMPTS={max_attempts}); events: {', '.join(history[-20:])}")
        rt.progress.begin_step(str(task.id), step.name, step.timeout_s)
        with rt.tracer.start_as_current_span(f"step {step.name}") as span:
            span.set_attribute("agent.task_id", str(task.id))
            span.set_attribute("agent.step", step.name)
            span.set_attribute("agent.step.attempt", attempts + 1)
            ctx = Context(rt, task, step.name, case, cp_seq, effects, config=config,
                          mcp_servers=getattr(agent, "mcp_servers", None))
            try:
                ret = step.fn(ctx)
            except TaskBlocked as exc:
                _step_event(rt.conn, task.id, step.name, "failed", f"{exc.reason}: {exc.detail}")
                rt.progress.end_step(None)
                return _block(rt, task.id, exc.reason, exc.detail)
            except CredentialUnavailable as exc:
                # Not the step's fault and not for a human to decide: the task waits (not counted as an attempt)
                # on the named credential, and the host resumes it once the vault holds it (`Host.work`).
                _step_event(rt.conn, task.id, step.name, "waiting", f"CredentialUnavailable: {exc}")
                rt.progress.end_step(None)
                return _block(rt, task.id, "credential_unavailable", str(exc), credential=exc.name)
            except ConnectionUnavailable as exc:
                # Like a missing credential: not the step's fault, so not counted as an attempt. A connection that
                # needs the customer blocks the task on its provider (the host resumes it when the customer has
                # connected again, `Host.recheck_credentials`); a control plane or provider that did not answer
                # is only "not now".
                _step_event(rt.conn, task.id, step.name, "waiting", f"ConnectionUnavailable: {exc}")
                rt.progress.end_step(None)
                if exc.transient:
                    log.warning("connection unavailable now; the task waits", extra={
                        "event": "connection_unavailable", "task_id": str(task.id), "provider": exc.provider})
                    return "retry"
                return _block(rt, task.id, "connection_needs_reauth", str(exc), credential=exc.provider)
            except EffectInDoubt as exc:
                _step_event(rt.conn, task.id, step.name, "waiting")
                rt.progress.end_step(None)
                log.warning("effect in doubt; will resolve by lookup on retry",
                            extra={"event": "effect_in_doubt", "task_id": str(task.id), "detail": str(exc)})
                return "retry"
            except RuntimeStateError as exc:
                _step_event(rt.conn, task.id, step.name, "failed", f"{type(exc).__name__}: {exc}")
                rt.progress.end_step(None)
                return _block(rt, task.id, _blocked_reason(exc), str(exc))
            except Exception as exc:
                error = step_error(exc, step.fn)
                _step_event(rt.conn, task.id, step.name, "failed", error)
                rt.progress.end_step(None)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, error[:300]))
                log.exception("step raised", extra={"event": "step_error", "task_id": str(task.id),
                                                     "step": step.name, "error": error})
                if attempts + 1 >= max_attempts:
                    return _block(rt, task.id, "poison_step", f"step {step.name!r} failed {attempts + 1} times "
                                  f"(AGENT_STEP_MAX_ATTEMPTS={max_attempts}); last error: {error}")
                return "retry"
            ctx.delta.done[step.name] = ret if ret is not None else True
            if content_enabled(span):
                span.set_attribute("agent.step.output", content(ctx.delta.done[step.name]))
            try:
                digest = tree_digest(workdir)
            except WorkspaceRefused as exc:  # the step left something no checkpoint can vouch for
                _step_event(rt.conn, task.id, step.name, "failed")
                rt.progress.end_step(None)
                return _block(rt, task.id, "workspace_refused", str(exc))
            # What the step hands over must be storable as it is: a value the database refuses would fail the
            # commit below on every attempt, and one that escaped it would take the worker down with it.
            problem = _unstorable_delta(step.name, ctx.delta)
            if problem is not None:
                _step_event(rt.conn, task.id, step.name, "failed")
                rt.progress.end_step(None)
                return _block(rt, task.id, "unstorable_result", problem)
            # The last step's checkpoint also finishes the task: one durable commit less per task.
            finished = all(s is step or s.name in case.steps_done for s in steps)
            try:
                ledger_pos = rt.ledger.position(task.id)
                # Checkpoint, case-file delta, 'done' event and the task's progress: one statement, so one round
                # trip and one atomic (synchronous) commit.
                new_cp = rt.checkpoints.commit_together(
                    task.id, step.name, ctx.delta, workspace_digest=digest, ledger_pos=ledger_pos,
                    branch=task.branch, snapshot_key=ctx.snapshot_key, seq=ctx._cp_seq + 1, writes=[
                        ("INSERT INTO step_events (task_id, step, event) VALUES (%s, %s, 'done')",
                         (task.id, step.name)),
                        ("UPDATE tasks SET progress_seq = progress_seq + 1, status = CASE WHEN status = ANY(%s)"
                         " THEN status ELSE 'done' END, blocked_reason = NULL, blocked_detail = NULL,"
                         " updated_at = clock_timestamp() WHERE id = %s", (list(task_store.ENDED_BY_REQUEST), task.id))
                        if finished else
                        ("UPDATE tasks SET progress_seq = progress_seq + 1 WHERE id = %s", (task.id,))])
            except (psycopg.DataError, psycopg.errors.ProgramLimitExceeded) as exc:
                # The database refused what the check above let through (its encoding, a size limit): the
                # transaction rolled back, and the same values would be refused again on every attempt.
                _step_event(rt.conn, task.id, step.name, "failed")
                rt.progress.end_step(None)
                reason = exc.diag.message_primary or str(exc).splitlines()[0]
                return _block(rt, task.id, "unstorable_result",
                              f"step {step.name!r}: the database refused to store its result or case-file "
                              f"entries ({exc.sqlstate or type(exc).__name__}: {reason[:300]})")
            span.set_attribute("agent.checkpoint_id", new_cp.id)
            cp_seq = new_cp.seq
            case = CaseFile({**case.steps_done, **ctx.delta.done},
                            {k: v for k, v in {**case.waiting_on, **ctx.delta.waiting}.items() if v is not None},
                            {**case.ruled_out, **ctx.delta.ruled_out}, {**case.notes, **ctx.delta.notes})
            rt.progress.end_step(new_cp.id)
    if not finished:
        task_store.set_status(rt.conn, task.id, "done")
    return "done"


def _halted(rt: Runtime, task_id: UUID) -> str | None:
    """'interrupted' or 'rolled_back' when a new message's thread policy ended the run (`state.threads`): it
    stops here, at a step boundary. A rolled-back run's working files are its uncommitted work and go (a host
    killed before this boundary removes them at its next boot: `discard_rolled_back_workdirs`); its checkpoints
    stay (the task never resumes) and its effects are facts the rollback was refused over."""
    status = rt.halted.get(str(task_id))
    if status is None:
        return None
    if status == "rolled_back":
        shutil.rmtree(task_workdir(rt, task_id), ignore_errors=True)
    log.info("run ended by a thread policy", extra={"event": "task_halted", "task_id": str(task_id),
                                                    "status": status})
    return status


def discard_rolled_back_workdirs(rt: Runtime) -> int:
    """Remove the working directory of every run a thread policy rolled back whose worker never reached the step
    boundary that removes it (`_halted`): the host was killed or stopped in between. Called at boot, before any
    task runs; a rolled-back run never resumes, so its directory is only its discarded, uncommitted work. Returns
    how many were removed."""
    tasks_dir = rt.workspace / "tasks"
    try:
        names = [p.name for p in tasks_dir.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return 0
    ids = []
    for name in names:
        try:
            ids.append(UUID(name))
        except ValueError:
            continue  # not a task's directory: not ours to judge
    if not ids:
        return 0
    rows = rt.conn.execute("SELECT id FROM tasks WHERE status = 'rolled_back' AND id = ANY(%s)", (ids,)).fetchall()
    for (task_id,) in rows:
        shutil.rmtree(task_workdir(rt, task_id), ignore_errors=True)
        log.info("working directory of a rolled-back run removed at boot",
                 extra={"event": "rolled_back_workdir_removed", "task_id": str(task_id)})
    return len(rows)


def restore_checkpoint(rt: Runtime, checkpoint: Checkpoint, *, fork: bool = False, reason: str = "") -> Checkpoint:
    """Make `checkpoint` the task's current state (a rollback).

    Allowed as is only when the world still matches it (workspace digest and effect-ledger position);
    otherwise RestoreRefused, unless `fork` is set, which records a new branch explicitly.
    """
    current = tree_digest(task_workdir(rt, checkpoint.task_id))
    position = rt.ledger.position(checkpoint.task_id)
    mismatches = []
    if current != checkpoint.workspace_digest:
        mismatches.append(f"workspace digest is {current[:12]}, checkpoint has {checkpoint.workspace_digest[:12]}")
    if position != checkpoint.ledger_pos:
        mismatches.append(f"effect ledger is at {position}, checkpoint was taken at {checkpoint.ledger_pos}")
    task = task_store.get(rt.conn, checkpoint.task_id)
    assert task is not None
    if mismatches and not fork:
        raise RestoreRefused(f"checkpoint {checkpoint.id} does not match the world: " + "; ".join(mismatches))
    with rt.conn.transaction():
        new_cp = rt.checkpoints.fork_from(checkpoint, new_branch=task.branch + 1, workspace_digest=current,
                                          ledger_pos=position,
                                          reason=reason or ("rollback: " + "; ".join(mismatches) or "rollback"))
        task_store.set_status(rt.conn, checkpoint.task_id, "pending")
    return new_cp
