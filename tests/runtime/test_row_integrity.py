"""Every durable row is integrity-checked on read: an edited judgment, effect, fact or summary is refused
with a clear reason (the task blocks, nothing is replayed or performed from it), and rows written before
the checksums existed are backfilled by the migration that added them."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from agent_runtime.db import connect
from agent_runtime.effects.ledger import args_digest, idempotency_key
from agent_runtime.errors import CorruptState
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.migrations import LATEST_VERSION, migrate
from agent_runtime.state.rowchecks import effect_checksum

from .conftest import Sinks, TenantDB
from .harness import schema_at_version

release = Agent("release")


@release.step
def scan(ctx: Context) -> Any:
    (ctx.workdir / "app.py").write_text("print('hi')\n")
    return ctx.judge("scan", passed=ctx.params.get("clean", False)).passed


@release.step
def publish(ctx: Context) -> Any:
    ctx.require_judgment("scan")
    return ctx.effect("email", {"from": "a@t", "to": "b@t", "subject": f"release {ctx.task_id}", "body": "v1"})


def test_an_edited_verdict_is_refused_not_relied_on(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    rt.stop_event.clear()
    tid = tasks.submit(rt.conn, "release", {"clean": False})
    assert run_task(rt, release, tid) == "blocked"  # the scan failed: judgment_invalid
    rt.conn.execute("UPDATE judgments SET passed = true")  # "the scan passed", written by hand
    rt.conn.execute("UPDATE tasks SET status = 'pending' WHERE id = %s", (tid,))
    assert run_task(rt, release, tid) == "blocked"
    task = tasks.get(rt.conn, tid)
    assert task is not None and task.blocked_reason == "corrupt_state" and "failed its checksum" in (
        task.blocked_detail or "")
    assert sinks.emails() == []


def test_an_edited_effect_result_is_not_replayed(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    tid = tasks.submit(rt.conn, "release", {"clean": True})
    assert run_task(rt, release, tid) == "done"
    rt.conn.execute("UPDATE effects SET result = '{\"message_id\": \"<forged>\"}'")
    with pytest.raises(CorruptState, match="failed its checksum"):
        rt.ledger.for_task(tid)
    assert len(sinks.emails()) == 1


def test_recorded_arguments_that_do_not_match_their_digest_are_never_performed(runtime: Runtime,
                                                                               sinks: Sinks) -> None:
    """An intent whose row is consistent but whose arguments were swapped under their digest: refused."""
    rt = runtime
    tid = tasks.submit(rt.conn, "release", {"clean": True})
    key = idempotency_key(tid, "publish", "email")
    recorded = {"from": "a@t", "to": "attacker@evil", "subject": "x", "body": "exfiltrated"}
    bogus_digest = args_digest({"from": "a@t", "to": "b@t", "subject": "x", "body": "v1"})
    rt.conn.execute(
        "INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, resolution, ordinal, checksum)"
        " VALUES (%s, 'publish', 'email', %s, %s, %s, 'intent', 'human:retry', 0, %s)",
        (tid, key, Jsonb(recorded), bogus_digest,
         effect_checksum(key, tid, "publish", "email", bogus_digest, "intent", None, "human:retry", 0, None)))
    with pytest.raises(CorruptState, match="do not match their digest"):
        rt.ledger.run(tid, "publish", "email", rt.effects["email"], recorded)
    assert sinks.emails() == []


def test_edited_facts_and_summaries_are_refused(runtime: Runtime) -> None:
    mem = MemoryStore(runtime.conn)
    mem.set_fact("plan", {"tier": "free"})
    mem.append("user", "hello")
    mem.add_summary(1, "the user said hello")
    runtime.conn.execute("""UPDATE facts SET value = '{"tier": "enterprise"}'""")
    with pytest.raises(CorruptState, match="fact 'plan' version 1 failed its checksum"):
        mem.get_fact("plan")
    runtime.conn.execute("UPDATE summaries SET content = 'the user is an admin'")
    with pytest.raises(CorruptState, match="summary .* failed its checksum"):
        mem.window(1000)


def test_rows_written_before_the_checksums_are_backfilled(tenant_db: TenantDB) -> None:
    """A schema at version 5 with a judgment, a fact, a summary and an effect, then `migrate` to the latest."""
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=False) as c:
        schema_at_version(c, 5)
        # The row a version-5 runtime's submit wrote (today's `tasks.submit` notifies a channel that version 19 makes).
        tid = uuid.uuid4()
        c.execute("INSERT INTO tasks (id, kind) VALUES (%s, 'release')", (tid,))
        c.execute("INSERT INTO judgments (task_id, name, artifact, artifact_digest, passed)"
                  " VALUES (%s, 'scan', 'workspace:x', 'd1', true)", (tid,))
        c.execute("INSERT INTO facts (key, version, value) VALUES ('plan', 1, '\"free\"')")
        c.execute("INSERT INTO summaries (thread, upto_seq, content, tokens) VALUES ('main', 0, 'old summary', 3)")
        c.execute("INSERT INTO effects (task_id, step, effect, idem_key, args, args_digest, state, result)"
                  " VALUES (%s, 'publish', 'email', 'eff-old', '{}', %s, 'committed', '{\"ok\": true}')",
                  (tid, args_digest({})))
        c.commit()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        assert migrate(c, tenant_db.schema) == LATEST_VERSION
        from agent_runtime.effects.ledger import EffectLedger
        from agent_runtime.state.judgments import JudgmentStore

        assert JudgmentStore(c).require("scan", "workspace:x", "d1").passed
        assert MemoryStore(c).get_fact("plan").value == "free"  # type: ignore[union-attr]
        assert MemoryStore(c).latest_summary().content == "old summary"  # type: ignore[union-attr]
        assert EffectLedger(c).get("eff-old").result == {"ok": True}  # type: ignore[union-attr]
        with pytest.raises(psycopg.errors.NotNullViolation):
            c.execute("INSERT INTO facts (key, version, value) VALUES ('unchecked', 1, 'null')")
