"""`agent-host`: the per-tenant agent process.

Start-up reads back before acting: single-writer lock, migrations, in-doubt effects (resolved by
provider lookup or blocked for a human), unfinished tasks and their latest good checkpoints, the memory
window, the semantic index; only then /readyz turns 200 and tasks resume (interrupted ones first).
/healthz is 200 only while the progress marker advances within the step timeout. SIGTERM: stop after the
current step (or abandon it at the end of the grace period), record a clean shutdown, exit 0.
`python -m agent_runtime.host submit --kind demo [--params JSON]` enqueues a task with the same env.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agent_runtime import tasks as task_store
from agent_runtime.config import HostConfig
from agent_runtime.credentials import ControlPlaneCredentialSource, CredentialSource, EnvCredentialSource
from agent_runtime.db import check_schema_name, connect, lock_key
from agent_runtime.demo import AGENTS
from agent_runtime.effects import EmailEffect, PaymentEffect
from agent_runtime.errors import ConfigError, CorruptState, RuntimeStateError, SchemaTooNew
from agent_runtime.ledger import Effect
from agent_runtime.logs import setup_json_logging
from agent_runtime.migrations import migrate
from agent_runtime.objectstore import EncryptedObjectStore, objectstore_from_url
from agent_runtime.progress import ProgressMarker
from agent_runtime.reasoning import DeterministicPlanner, OpenAIChatPlanner, Planner
from agent_runtime.runner import Runtime, run_task

__all__ = ["main"]

log = logging.getLogger("agent_runtime.host")

EXIT_CONFIG = 2
EXIT_LOCKED = 3
EXIT_SCHEMA = 4


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
        self.read_back: dict[str, Any] = {}
        self.lock_conn: psycopg.Connection | None = None

    # --- wiring ------------------------------------------------------------------------------
    def credentials(self) -> CredentialSource:
        if self.cfg.control_plane_url and self.cfg.instance_token:
            return ControlPlaneCredentialSource(self.cfg.control_plane_url, self.cfg.instance_token)
        return EnvCredentialSource()

    def effects(self) -> dict[str, Effect]:
        out: dict[str, Effect] = {}
        if self.cfg.smtp_url:
            out["email"] = EmailEffect(self.cfg.smtp_url)
        if self.cfg.payments_url:
            out["payment"] = PaymentEffect(self.cfg.payments_url)
        return out

    def planner(self, creds: CredentialSource) -> Planner:
        if self.cfg.planner == "openai":
            if not self.cfg.llm_url:
                raise ConfigError("AGENT_PLANNER=openai needs AGENT_LLM_URL")
            return OpenAIChatPlanner(self.cfg.llm_url, self.cfg.llm_model, creds)
        return DeterministicPlanner()

    def build_runtime(self, conn: psycopg.Connection) -> Runtime:
        store = EncryptedObjectStore(objectstore_from_url(self.cfg.objectstore_url), self.cfg.object_key,
                                     self.cfg.tenant_id, self.cfg.previous_object_keys)
        creds = self.credentials()
        return Runtime(conn=conn, tenant_id=self.cfg.tenant_id, volume=self.cfg.volume, store=store,
                       credentials=creds, effects=self.effects(), planner=self.planner(creds),
                       progress=self.progress, stop_event=self.stop_event,
                       on_workspace_mismatch=self.cfg.on_workspace_mismatch,
                       checkpoint_interval_s=self.cfg.checkpoint_interval_s,
                       keep_latest=self.cfg.checkpoint_keep_latest, step_max_attempts=self.cfg.step_max_attempts)

    # --- start-up ----------------------------------------------------------------------------
    def acquire_single_writer_lock(self) -> None:
        self.lock_conn = connect(self.cfg.database_url, self.cfg.schema, autocommit=True)
        row = self.lock_conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key("host", self.cfg.schema),)
        ).fetchone()
        if not (row and row[0]):
            raise SystemExit(self._die(EXIT_LOCKED, f"another agent-host is already running against schema "
                                                    f"{self.cfg.schema}; refusing to start a second writer"))

    def _die(self, code: int, message: str) -> int:
        log.error(message, extra={"event": "host_refused", "exit_code": code})
        print(f"agent-host: {message}", file=sys.stderr, flush=True)
        return code

    def read_back_state(self, rt: Runtime) -> dict[str, Any]:
        """Everything the host must know before acting; blocks what cannot be resumed safely."""
        t0 = time.perf_counter()
        summary: dict[str, Any] = {"resolved_effects": 0, "blocked_effects": 0}
        for rec in rt.ledger.open_effects():
            if rec.state != "intent" or rec.resolution == "human:retry":
                continue
            effect = rt.effects.get(rec.effect)
            if effect is None or not effect.supports_lookup:
                rt.conn.execute("UPDATE effects SET state = 'blocked', resolution = 'no_provider_lookup'"
                                " WHERE id = %s", (rec.id,))
                task_store.set_status(rt.conn, rec.task_id, "blocked", "effect_in_doubt",
                                      f"{rec.effect} ({rec.idem_key}) needs a human decision")
                summary["blocked_effects"] += 1
                continue
            try:
                found = effect.lookup(rec.idem_key)
            except Exception as exc:  # provider down: the step's own replay will ask again
                log.warning("in-doubt lookup failed", extra={"event": "in_doubt_lookup_failed",
                                                             "idem_key": rec.idem_key, "error": repr(exc)})
                continue
            if found is not None:
                rt.conn.execute("UPDATE effects SET state = 'committed', result = %s,"
                                " resolution = 'provider_lookup:found', settled_at = clock_timestamp()"
                                " WHERE id = %s AND state = 'intent'", (Jsonb(found), rec.id))
                summary["resolved_effects"] += 1
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
            from agent_runtime.semantic import SemanticIndex, embedder_from_name

            summary["semantic"] = SemanticIndex(rt.conn, rt.store, embedder_from_name(self.cfg.embedder)).boot()
        except RuntimeStateError as exc:
            summary["semantic"] = {"error": str(exc)}
        summary["resumable"] = resumable
        summary["read_back_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return summary

    # --- threads -----------------------------------------------------------------------------
    def work(self, rt: Runtime) -> None:
        while not self.stop_event.is_set():
            try:
                pending = task_store.unfinished(rt.conn)
                if not pending:
                    self.progress.idle()
                    self.stop_event.wait(self.cfg.poll_interval_s)
                    continue
                for task in pending:
                    if self.stop_event.is_set():
                        break
                    agent = AGENTS.get(task.kind)
                    if agent is None:
                        task_store.set_status(rt.conn, task.id, "failed", "unknown_kind", task.kind)
                        continue
                    outcome = run_task(rt, agent, task.id)
                    log.info("task outcome", extra={"event": "task_outcome", "task_id": str(task.id),
                                                    "outcome": outcome})
                    if outcome == "retry":
                        self.stop_event.wait(0.2)
            except psycopg.OperationalError as exc:
                log.error("database unavailable; retrying", extra={"event": "db_error", "error": str(exc)})
                self.stop_event.wait(1.0)

    def heartbeat_loop(self) -> None:
        url, token = self.cfg.control_plane_url, self.cfg.instance_token
        if not (url and token):
            return
        while not self.stop_event.wait(self.cfg.heartbeat_interval_s):
            self.send_heartbeat(url, token)

    def send_heartbeat(self, url: str, token: str, status: str | None = None) -> None:
        v = self.progress.view()
        body = {"task": v.task, "step": v.step, "checkpoint": v.checkpoint, "progress_seq": v.progress_seq,
                "status": status or (v.status if self.healthy()[0] else "stalled")}
        req = urllib.request.Request(  # noqa: S310 - operator-configured control plane
            f"{url.rstrip('/')}/internal/v1/heartbeat", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=2.0):  # noqa: S310
                pass
        except Exception as exc:
            log.warning("heartbeat failed", extra={"event": "heartbeat_failed", "error": type(exc).__name__})

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        v = self.progress.view()
        info = {"task": v.task, "step": v.step, "checkpoint": v.checkpoint, "progress_seq": v.progress_seq,
                "busy": v.busy, "seconds_since_progress": round(v.seconds_since_advance, 2)}
        if self.worker is not None and not self.worker.is_alive() and not self.stop_event.is_set():
            return False, {**info, "reason": "worker thread died"}
        if v.busy and v.seconds_since_advance > self.cfg.step_timeout_s:
            return False, {**info, "reason": f"no progress for more than {self.cfg.step_timeout_s}s"}
        return True, info

    def serve_http(self) -> ThreadingHTTPServer:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/healthz":
                    ok, info = host.healthy()
                    self._send(200 if ok else 503, {"healthy": ok, **info})
                elif self.path == "/readyz":
                    ready = host.ready.is_set() and not host.stop_event.is_set()
                    self._send(200 if ready else 503, {"ready": ready, "read_back": host.read_back})
                else:
                    self._send(404, {"error": "not found"})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer((self.cfg.http_host, self.cfg.http_port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                         name="http").start()
        _write_atomic(self.cfg.host_dir / "http-port", str(server.server_address[1]))
        return server

    # --- life cycle --------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        cfg.host_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg.workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.acquire_single_writer_lock()
        assert self.lock_conn is not None
        _write_atomic(cfg.host_dir / "pid", str(os.getpid()))
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        server = self.serve_http()
        conn = connect(cfg.database_url, cfg.schema, autocommit=True)
        try:
            version = migrate(conn, cfg.schema)
        except SchemaTooNew as exc:
            return self._die(EXIT_SCHEMA, str(exc))
        rt = self.build_runtime(conn)
        self.read_back = {"schema_version": version, **self.read_back_state(rt)}
        conn.execute("INSERT INTO host_events (kind, detail) VALUES ('boot', %s)",
                     (Jsonb({"pid": os.getpid(), **self.read_back}),))
        log.info("read-back done; ready", extra={"event": "ready", **self.read_back})
        self.ready.set()
        _write_atomic(cfg.host_dir / "status", json.dumps({"state": "ready", "pid": os.getpid()}))
        self.worker = threading.Thread(target=self.work, args=(rt,), name="worker", daemon=True)
        self.worker.start()
        threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True).start()
        while not self.stop_event.wait(0.1):
            if not self.worker.is_alive():
                break
        return self.shutdown(server)

    def shutdown(self, server: ThreadingHTTPServer) -> int:
        t0 = time.monotonic()
        assert self.worker is not None and self.lock_conn is not None
        self.stop_event.set()
        self.worker.join(timeout=max(0.0, self.cfg.grace_period_s - 0.5))
        view = self.progress.view()
        abandoned = self.worker.is_alive()
        if abandoned and view.task and view.step:
            # The step could not finish in the grace period: it stays un-done and re-runs on next boot.
            self.lock_conn.execute("INSERT INTO step_events (task_id, step, event) VALUES (%s, %s, 'abandoned')",
                                   (view.task, view.step))
        detail = {"pid": os.getpid(), "abandoned_step": view.step if abandoned else None, "task": view.task,
                  "seconds": round(time.monotonic() - t0, 3)}
        self.lock_conn.execute("INSERT INTO host_events (kind, detail) VALUES ('clean_shutdown', %s)",
                               (Jsonb(detail),))
        if self.cfg.control_plane_url and self.cfg.instance_token:
            self.send_heartbeat(self.cfg.control_plane_url, self.cfg.instance_token, status="stopped")
        _write_atomic(self.cfg.host_dir / "status", json.dumps({"state": "stopped", **detail}))
        log.info("clean shutdown", extra={"event": "clean_shutdown", **detail})
        server.shutdown()
        logging.shutdown()
        if abandoned:
            os._exit(0)  # the worker thread is stuck inside the step; nothing of it is committed
        return 0


def submit_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent-host submit")
    parser.add_argument("--kind", required=True)
    parser.add_argument("--params", default="{}")
    args = parser.parse_args(argv)
    try:
        params = json.loads(args.params)
        dsn, schema = os.environ["AGENT_DATABASE_URL"], check_schema_name(os.environ["AGENT_SCHEMA"])
    except (ValueError, KeyError) as exc:
        print(f"agent-host submit: {exc!r}", file=sys.stderr)
        return EXIT_CONFIG
    with connect(dsn, schema, autocommit=True) as conn:
        migrate(conn, schema)
        print(task_store.submit(conn, args.kind, params))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "submit":
        return submit_main(argv[1:])
    setup_json_logging()
    try:
        cfg = HostConfig.from_env()
    except ConfigError as exc:
        print(f"agent-host: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    return Host(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
