"""`Context`: what a step may do. Every durable side of it goes through the runtime's stores.

A step gets one `Context` per attempt. Its durable operations are named so that a replay finds them again:
`ctx.tool(name, args, fn)` is cached by (agent kind, tool, args) unless `shared=True`; `ctx.effect(name, args)`
is keyed by (task, step, effect name, its ordinal among this step's calls of that effect) or by the explicit
`key=`; `ctx.schedule(...)` is such an effect too, made by the control plane under the effect's key;
`ctx.mcp(server).call(tool, args)` goes to one of those two, or is simply called, by the tool's kind (`sdk.mcp`);
judgments are bound to the digest of the task's working directory as it is when they are made, and a judgment the
step required is checked again at the moment of each of its effects, with restores of the directory held off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent_runtime.errors import ConfigError, CredentialUnavailable, EffectFailed, EffectInDoubt, TaskBlocked
from agent_runtime.host.connections import TaskConnectionSource
from agent_runtime.host.credentials import Credential, CredentialSource, RecordingCredentialSource
from agent_runtime.host.schedules import SCHEDULE_EFFECT
from agent_runtime.host.tracing import content, content_enabled, current_span_name
from agent_runtime.mcp.config import McpServerSpec, servers_from_config
from agent_runtime.sdk.connections import Connections
from agent_runtime.sdk.mcp import McpServer
from agent_runtime.state import tasks as task_store
from agent_runtime.state.checkpoints import CaseDelta, CaseFile
from agent_runtime.state.judgments import Judgment
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.toolcache import SHARED_SCOPE, kind_scope
from agent_runtime.state.usage import usage_record
from agent_runtime.state.workspace import snapshot, tree_digest, workspace_lock

if TYPE_CHECKING:
    from agent_runtime.host.runner import Runtime

__all__ = ["Context"]

T = TypeVar("T")


def task_workdir(workspace: Path, task_id: Any) -> Path:
    return workspace / "tasks" / str(task_id)


class Context:
    """The step's view of its task and of the instance's durable stores."""

    def __init__(self, rt: Runtime, task: task_store.Task, step: str, case: CaseFile, checkpoint_seq: int,
                 effects: Mapping[str, Any] | None = None, *, config: Mapping[str, Any] | None = None,
                 mcp_servers: Mapping[str, McpServerSpec] | None = None) -> None:
        self.rt = rt
        self._release_mcp = dict(mcp_servers or {})  # the agent's own (Agent(mcp_servers=...)): stdio ones too
        self._config = config
        self.task = task
        self.step = step
        self.case = case
        self.delta = CaseDelta()
        self.snapshot_key: str | None = None
        self._effects = effects if effects is not None else rt.effects
        self._ordinals: dict[str, int] = {}
        self._mcp: dict[str, McpServer] = {}
        self._last_timer_cp = time.monotonic()
        self._cp_seq = checkpoint_seq
        self._stream_attempt: str | None = None
        # Judgments this attempt relied on (name, artifact): every effect it makes re-checks them.
        self._guards: list[tuple[str, str]] = []

    # --- what the task is ----------------------------------------------------------------------
    @property
    def task_id(self) -> str:
        return str(self.task.id)

    @property
    def params(self) -> dict[str, Any]:
        return self.task.params

    @property
    def config(self) -> Mapping[str, Any]:
        """This task's agent configuration: the release's defaults with the customer's overrides on top, as the
        control plane gave them when the task started (kept across a crash; the next task sees a change). A
        property the schema marks ``"format": "credential"`` holds a credential's NAME: pass it to
        ``ctx.credentials.get(...)`` (or use ``ctx.config_credential(key)``) for the value."""
        return self._config if self._config is not None else self.rt.agent_config

    def config_credential(self, key: str) -> Credential:
        """The credential named by the configuration property ``key`` (a ``"format": "credential"`` field), asked
        from the source of truth now; TaskBlocked('config_missing') if the configuration names none."""
        name = self.config.get(key)
        if not isinstance(name, str) or not name:
            raise TaskBlocked("config_missing", f"the agent configuration names no credential in {key!r}")
        return self.credential(name)

    @property
    def workdir(self) -> Path:
        """This task's working directory on the instance's volume (created on first use)."""
        path = task_workdir(self.rt.workspace, self.task.id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def memory(self) -> MemoryStore:
        """The conversation log ('main' thread; `ctx.memory.in_thread(name)` for others) and facts."""
        return self.rt.memory

    @property
    def effect_providers(self) -> Mapping[str, Any]:
        """The effect providers this step's effects use, by name (for integrations that call the ledger)."""
        return self._effects

    @property
    def credentials(self) -> CredentialSource:
        """The instance's credential source: `ctx.credentials.get(name)` asks the source of truth now (and, inside
        a `tool()` fetch, records the credential's version as the authority of the output)."""
        return RecordingCredentialSource(self.rt.credentials, lambda: self._tool_fetches)

    @property
    def connections(self) -> Connections:
        """The customer's connected accounts: `ctx.connections.get("google").access_token()` asks the control
        plane for a current token of this tenant's own connection, now (ConnectionUnavailable blocks the task
        `connection_needs_reauth` until the customer connects again). Every request names this task: an end
        user's task gets that end user's connection (docs/connections.md)."""
        return Connections(TaskConnectionSource(self.rt.connections, self.task_id))

    # --- the case file -------------------------------------------------------------------------
    def note(self, key: str, value: Any) -> None:
        """Record a note in the case file; committed with this step's checkpoint."""
        self.delta.notes[key] = value

    def rule_out(self, key: str, why: str) -> None:
        self.delta.ruled_out[key] = why

    def wait_on(self, key: str, what: str | None) -> None:
        """Record what the task is waiting on (None clears it)."""
        self.delta.waiting[key] = what

    # --- durable operations --------------------------------------------------------------------
    # The credentials read by each tool() fetch under way, innermost last (a fetch may call another tool).
    _tool_fetches: tuple[set[tuple[str, int]], ...] = ()

    def tool(self, name: str, args: Any, call: Callable[[], T], *, credential: str | None = None,
             ttl: float | None = None, shared: bool = False) -> T:
        """Call `call` at most once per (tool, args) while its cached output is fresh; return the output.

        The output is this agent kind's: another kind calling the same tool with the same arguments pays
        for its own, unless both say `shared=True` (tenant-wide). `ttl`: seconds the output stays fresh (an
        expired output is fetched again, never served); None takes the instance's table (`tool_ttl_s`, else
        one day).

        Every credential read while `call` runs (`ctx.credentials.get`, `ctx.credential`, a tool called inside
        it, or `credential=`) is recorded with its version: a cached output is served only while each of them
        is still at that version; otherwise `call` runs again (and meets the revocation itself).
        `credential`: the credential the call is made under. It is checked with the source of truth now
        (revoked: CredentialUnavailable), and only an output fetched under it is served.
        """
        with self.rt.tracer.start_as_current_span(
                f"execute_tool {name}", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                                    "agent.tool.shared": shared}) as span:
            if content_enabled(span):
                span.set_attribute("gen_ai.tool.call.arguments", content(args))
            hit, value = self._tool_run(name, args, call, credential=credential, ttl=ttl, shared=shared)
            span.set_attribute("agent.tool.cached", hit)
            if content_enabled(span):
                span.set_attribute("gen_ai.tool.call.result", content(value))
            return value

    def _tool_run(self, name: str, args: Any, call: Callable[[], T], *, credential: str | None, ttl: float | None,
                  shared: bool) -> tuple[bool, T]:
        """`tool` without its span: (whether the cache answered, the output)."""
        reads: set[tuple[str, int]] = set()
        current: dict[str, int | None] = {}
        required: tuple[str, ...] = ()
        if credential is not None:
            held = self.credential(credential)
            reads.add((held.name, held.version))
            current[held.name] = held.version
            required = (held.name,)

        def holds(cred: str, version: int) -> bool:
            # Asked through the recording source: a hit inside an enclosing fetch hands that fetch its authority.
            if cred not in current:
                try:
                    current[cred] = self.credentials.get(cred).version
                except CredentialUnavailable:
                    current[cred] = None
            return current[cred] == version

        cache = self.rt.tool_cache
        scope = SHARED_SCOPE if shared else kind_scope(self.task.kind)
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl of tool {name!r} must be a positive number of seconds, not {ttl!r}")
        hit, value = cache.lookup(name, args, holds, required, scope=scope)
        if hit:
            return True, value
        self._tool_fetches = (*self._tool_fetches, reads)
        try:
            value = call()
        finally:
            self._tool_fetches = tuple(r for r in self._tool_fetches if r is not reads)
        # A fetch inside another one: its reads went into both recordings, so the outer output holds them too.
        cache.store_result(name, args, value, reads, scope=scope, ttl_s=ttl)
        return False, value

    def effect(self, name: str, args: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        """Perform the irreversible effect `name` at most once and return the provider's recorded answer.

        Without `key`, the n-th call of `name` in this step is the same logical call on every replay. With
        `key`, the call is the one named by that key for this tenant, in any task; the same key with other
        arguments is refused (EffectKeyConflict) rather than dropped or overwritten.
        """
        adapter = self._effects.get(name)
        if adapter is None:
            raise TaskBlocked("effect_unconfigured", f"no provider is configured for effect {name!r} "
                                                     f"(configured: {sorted(self._effects) or 'none'})")
        return self._ledger_effect(name, adapter, args, ordinal=0 if key is not None else self._next_ordinal(name),
                                   key=key)

    def _next_ordinal(self, name: str) -> int:
        """The ordinal of this call among the step's calls of `name` (its derived key's last part)."""
        ordinal = self._ordinals.get(name, 0)
        self._ordinals[name] = ordinal + 1
        return ordinal

    def _ledger_knows(self, name: str, ordinal: int, key: str | None) -> bool:
        """Whether the ledger (table or journal) already holds this call of `name` as an effect."""
        idem_key = self.rt.ledger.key_for(self.task.id, self.step, name, ordinal=ordinal, explicit_key=key)
        if self.rt.ledger.get(idem_key) is not None:
            return True
        return self.rt.ledger.journal is not None and self.rt.ledger.journal.get(idem_key) is not None

    def _ledger_effect(self, name: str, adapter: Any, args: dict[str, Any], *, ordinal: int,
                       key: str | None) -> dict[str, Any]:
        """Perform `name` through `adapter` under the ledger, re-checking the judgments the step relies on, in an
        `effect <name>` span with its idempotency key and outcome: performed (now), replayed (the ledger's record
        answered), in_doubt, failed or blocked."""
        idem_key = self.rt.ledger.key_for(self.task.id, self.step, name, ordinal=ordinal, explicit_key=key)
        with self.rt.tracer.start_as_current_span(
                f"effect {name}", attributes={"agent.effect.name": name, "agent.effect.idempotency_key": idem_key}
        ) as span:
            if content_enabled(span):
                span.set_attribute("agent.effect.arguments", content(args))
            outcome = "error"
            try:
                result, replayed = self._ledger_run(name, adapter, args, ordinal=ordinal, key=key)
                outcome = "replayed" if replayed else "performed"
            except EffectInDoubt:
                outcome = "in_doubt"
                raise
            except EffectFailed:
                outcome = "failed"
                raise
            except TaskBlocked:
                outcome = "blocked"
                raise
            finally:
                span.set_attribute("agent.effect.outcome", outcome)
            if content_enabled(span):
                span.set_attribute("agent.effect.result", content(result))
            return result

    def _ledger_run(self, name: str, adapter: Any, args: dict[str, Any], *, ordinal: int,
                    key: str | None) -> tuple[dict[str, Any], bool]:
        if not self._guards:
            return self.rt.ledger.run_reporting(self.task.id, self.step, name, adapter, args, ordinal=ordinal,
                                      explicit_key=key)
        # The step acts on a judgment: the files must still be the judged ones when the effect happens, and a
        # restore must not swap them between this check and the call (JudgmentInvalid blocks the task).
        workdir = self.workdir
        with workspace_lock(workdir):
            digest = tree_digest(workdir)
            for judgment, artifact in self._guards:
                self.rt.judgments.require(judgment, artifact, digest)
            return self.rt.ledger.run_reporting(self.task.id, self.step, name, adapter, args, ordinal=ordinal,
                                      explicit_key=key)

    def schedule(self, *, at: datetime | timedelta | None = None, cron: str | None = None, timezone: str = "UTC",
                 kind: str | None = None, params: dict[str, Any] | None = None, thread: str | None = None,
                 message: str | None = None, name: str | None = None, catch_up: str = "latest",
                 key: str | None = None) -> dict[str, Any]:
        """Schedule the agent's own work: a task `kind` with `params`, or `message` into `thread`, once `at` a
        moment (an aware datetime, or a timedelta from when the schedule is made: "in three days") or on `cron`
        in `timezone` (5 fields, or 6 with seconds last). Returns the control plane's schedule (`id`, `name`,
        `status`, `next_fires`, ...).

        Recorded as an effect (`schedule`) in the ledger and made by the control plane under the effect's
        idempotency key: a step replayed after a crash gets the schedule its first run made, never a second one.
        `key` names the call for this tenant across tasks, as `ctx.effect(..., key=)`: one follow-up per invoice,
        ever. `name` (unique per customer) defaults to one made from the key; `catch_up`: skip, latest or all.
        """
        if (at is None) == (cron is None):
            raise ValueError("ctx.schedule needs exactly one of `at` (once) or `cron` (repeating)")
        if (kind is None) == (message is None and thread is None):
            raise ValueError("ctx.schedule needs exactly one of `kind` (a task) or `thread` and `message`")
        args: dict[str, Any] = {"timezone": timezone, "catch_up": catch_up, "created_by_task": self.task_id}
        if isinstance(at, timedelta):
            if at.total_seconds() < 1:
                raise ValueError("a relative `at` must be at least one second away")
            args["in_s"] = math.ceil(at.total_seconds())
        elif at is not None:
            if at.tzinfo is None or at.utcoffset() is None:
                raise ValueError("`at` must be an aware datetime (with its time zone), or a timedelta")
            args["at"] = at.isoformat()
        else:
            args["cron"] = cron
        if kind is not None:
            args["task"] = {"kind": kind, "params": dict(params or {})}
        else:
            if not thread or not message:
                raise ValueError("a message schedule needs both `thread` and `message`")
            args["message"] = {"thread": thread, "content": message}
        if name is not None:
            args["name"] = name
        if self.rt.schedules is None:
            raise TaskBlocked("schedules_unavailable", "ctx.schedule needs the control plane (AGENT_CONTROL_PLANE_URL "
                                                       "and AGENT_INSTANCE_TOKEN): nothing else can fire a schedule")
        ordinal = 0 if key is not None else self._next_ordinal(SCHEDULE_EFFECT)
        return self._ledger_effect(SCHEDULE_EFFECT, self.rt.schedules, args, ordinal=ordinal, key=key)

    def mcp(self, server: str) -> McpServer:
        """The MCP server `server` as configured for this task (the configuration's `mcp` key over the instance's
        `AGENT_MCP_SERVERS`, over the agent's own `Agent(mcp_servers=...)`): `.call(tool, args)` sends each call
        where its kind belongs, `.tools()` lists them for a chat model. TaskBlocked when no such server is
        configured or its configuration is unusable."""
        try:
            servers = {**self._release_mcp, **self.rt.mcp_servers, **servers_from_config(self.config)}
        except ConfigError as exc:
            raise TaskBlocked("mcp_config_invalid", str(exc)) from exc
        spec = servers.get(server)
        if spec is None:
            raise TaskBlocked("mcp_unconfigured", f"no MCP server {server!r} is configured "
                                                  f"(configured: {sorted(servers) or 'none'})")
        handle = self._mcp.get(server)
        if handle is None or handle.spec != spec:
            handle = self._mcp[server] = McpServer(self, spec)
        return handle

    def usage(self, *, model: str, input_tokens: int, output_tokens: int, key: str | None = None) -> bool:
        """Report one model call's tokens (what the provider's answer says it used), for the operator's bill.

        Written at once, so a crash later in the step cannot lose it. `key`: the provider's id for the call (a
        chat completion's `id`); the same call reported again (its answer served from `ctx.tool`'s cache with its
        usage) then counts once. Returns False for such a repeat. Report inside the `ctx.tool` fetch that calls
        the model and a cached answer is never reported at all.
        """
        counted = usage_record(self.rt.conn, task_id=self.task.id, step=self.step, model=model,
                               input_tokens=input_tokens, output_tokens=output_tokens, key=key)
        tokens = {"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens}
        if current_span_name().startswith("chat "):
            return counted  # inside a model call's span (ChatModel): that span carries the counts already
        # The agent's own client: the call is over, so its span is an instant that carries what was reported.
        with self.rt.tracer.start_as_current_span(
                f"chat {model}", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                             **tokens, **({"gen_ai.response.id": key} if key else {})}):
            pass
        return counted

    def credential(self, name: str) -> Credential:
        """Always asks the source of truth: a rollback can never resurrect a revoked credential (inside a
        `tool()` fetch, its version becomes part of the output's authority)."""
        return self.credentials.get(name)

    def workspace_digest(self) -> str:
        return tree_digest(self.workdir)

    def judge(self, name: str, passed: bool, detail: dict[str, Any] | None = None) -> Judgment:
        """Record a verdict bound to the digest of the working directory as it is now."""
        return self.rt.judgments.record(task_id=self.task.id, name=name, artifact=f"workspace:{self.task.id}",
                                        artifact_digest=self.workspace_digest(), passed=passed, detail=detail)

    def require_judgment(self, name: str) -> Judgment:
        """The passing verdict `name` for the files exactly as they are now, else JudgmentInvalid.

        It also guards the rest of the step: each later `effect()` of this step checks the verdict again
        against the files as they are at that moment.
        """
        artifact = f"workspace:{self.task.id}"
        judgment = self.rt.judgments.require(name, artifact, self.workspace_digest())
        if (name, artifact) not in self._guards:
            self._guards.append((name, artifact))
        return judgment

    def snapshot_workspace(self) -> str:
        key, _digest = snapshot(self.rt.conn, self.rt.store, self.workdir, scope=f"task/{self.task.id}")
        self.snapshot_key = key
        return key

    # --- conversations ------------------------------------------------------------------------
    @property
    def thread(self) -> str:
        """The conversation this task answers (a message's task has params `thread` and `question`)."""
        thread = self.task.params.get("thread")
        if not isinstance(thread, str) or not thread:
            raise TaskBlocked("bad_params", "this task has no 'thread': it was not started by a message")
        return thread

    def stream(self, text: str) -> None:
        """Send a chunk of the reply being produced to whoever is watching (the instance API's reply stream).

        Chunks are previews, never stored: a re-run of the step after a crash streams again under a new
        attempt. The reply that counts is the one `ctx.reply` appends.
        """
        if self._stream_attempt is None:
            self._stream_attempt = self.rt.streams.begin(self.task_id)
        self.rt.streams.publish(self.task_id, str(text), self._stream_attempt)
        self.rt.progress.advance()

    def reply(self, text: str, *, metadata: dict[str, Any] | None = None) -> int:
        """Append the agent's reply to the task's thread once; return its seq.

        A re-run of the step (the instance died after the append, before the checkpoint) finds the reply it
        wrote by the task id instead of appending a second one.
        """
        thread = self.thread
        row = self.rt.conn.execute(
            "SELECT seq FROM messages WHERE metadata ? 'task' AND metadata->>'task' = %s"
            " AND metadata->>'turn' = 'answer' ORDER BY seq LIMIT 1", (self.task_id,)).fetchone()
        if row is not None:
            return int(row[0])
        meta = {**(metadata or {}), "task": self.task_id, "turn": "answer"}
        if self.task.params.get("message_id"):
            meta["reply_to"] = str(self.task.params["message_id"])
        seq = self.memory.in_thread(thread).append("assistant", str(text), meta)
        self.rt.streams.wake()
        return seq

    def progress(self, note: Any = None) -> None:
        """Called by long steps: advances the progress marker and, on a timer, writes a 'timer' checkpoint."""
        self.rt.progress.advance()
        if time.monotonic() - self._last_timer_cp < self.rt.checkpoint_interval_s:
            return
        self._last_timer_cp = time.monotonic()
        self._cp_seq += 1
        with self.rt.conn.transaction():
            cp = self.rt.checkpoints.commit(
                self.task.id, self.step, CaseDelta(notes={f"progress:{self.step}": note}),
                workspace_digest=self.workspace_digest(), ledger_pos=self.rt.ledger.position(self.task.id),
                kind="timer", branch=self.task.branch, seq=self._cp_seq)
        self.rt.progress.advance(cp.id)
