"""The tool cache is per agent kind unless a call says `shared=True`, and `ttl=` bounds how long an output is
served: a chat agent never gets the refund agent's cached order, and an expired output is fetched again."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agent_runtime.db import connect
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.migrations import LATEST_VERSION, migrate
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from agent_runtime.state.toolcache import LEGACY_SCOPE, SHARED_SCOPE, ToolCache, kind_scope

from .conftest import TenantDB
from .harness import schema_at_version

# Every paid call: (agent kind, what it fetched).
calls: list[tuple[str, str]] = []


def _order_agent(kind: str) -> Agent:
    """An agent whose one step looks up order 7 through the tool `orders.get`, as `kind` sees orders."""
    agent = Agent(kind)

    @agent.step
    def look_up(ctx: Context) -> Any:
        def fetch() -> dict[str, Any]:
            calls.append((kind, ctx.params.get("tag", "")))
            return {"order": 7, "seen_by": kind, "tag": ctx.params.get("tag", "")}

        return ctx.tool("orders.get", {"order": 7}, fetch, shared=bool(ctx.params.get("shared")),
                        ttl=ctx.params.get("ttl"))

    return agent


refund = _order_agent("refund")
chat = _order_agent("chat")


def _run(rt: Runtime, agent: Agent, **params: Any) -> None:
    tid = tasks.submit(rt.conn, agent.kind, params)
    assert run_task(rt, agent, tid) == "done"


def test_two_kinds_never_read_each_others_outputs(runtime: Runtime) -> None:
    calls.clear()
    _run(runtime, refund, tag="r1")
    _run(runtime, refund, tag="r2")  # the refund agent's own hit
    assert calls == [("refund", "r1")]
    _run(runtime, chat, tag="c1")  # same tool, same args, another kind: fetched for the chat agent
    _run(runtime, chat, tag="c2")
    assert calls == [("refund", "r1"), ("chat", "c1")]
    scopes = runtime.conn.execute("SELECT scope FROM tool_cache WHERE tool = 'orders.get' ORDER BY scope").fetchall()
    assert [s for (s,) in scopes] == [kind_scope("chat"), kind_scope("refund")]


def test_shared_outputs_are_tenant_wide_and_only_for_shared_calls(runtime: Runtime) -> None:
    calls.clear()
    _run(runtime, refund, tag="r1", shared=True)
    _run(runtime, chat, tag="c1", shared=True)  # served the refund agent's shared output
    assert calls == [("refund", "r1")]
    _run(runtime, chat, tag="c2")  # a kind-scoped call does not read the shared row
    assert calls == [("refund", "r1"), ("chat", "c2")]
    assert runtime.tool_cache.lookup("orders.get", {"order": 7}, scope=SHARED_SCOPE)[1]["seen_by"] == "refund"


def test_an_expired_output_is_fetched_again_never_served(runtime: Runtime) -> None:
    calls.clear()
    _run(runtime, refund, tag="t1", ttl=0.5)
    _run(runtime, refund, tag="t2", ttl=0.5)
    assert calls == [("refund", "t1")]
    left = runtime.conn.execute("SELECT extract(epoch FROM expires_at - created_at) FROM tool_cache"
                                " WHERE tool = 'orders.get'").fetchone()
    assert left is not None and 0.4 < float(left[0]) <= 0.501  # two clock reads a microsecond apart
    time.sleep(0.7)
    _run(runtime, refund, tag="t3", ttl=0.5)
    assert calls == [("refund", "t1"), ("refund", "t3")]
    _run(runtime, refund, tag="t4", ttl=0.5)
    assert calls == [("refund", "t1"), ("refund", "t3")]


def test_rows_from_before_scopes_are_served_to_no_kind(tenant_db: TenantDB, tmp_path: Path) -> None:
    """A schema at version 11 with a cached output, migrated: the row is kept under `legacy`, which no lookup
    asks for, so neither kind (nor a shared call) is served what an unknown kind fetched."""
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=False) as c:
        schema_at_version(c, 11)
        c.execute("INSERT INTO tool_cache (tool, args_hash, inline_value, size, content_hash)"
                  " VALUES ('orders.get', %s, %s, 2, 'x')", (ToolCache.args_hash({"order": 7}), b"{}"))
        c.commit()
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        assert migrate(c, tenant_db.schema) == LATEST_VERSION
        assert c.execute("SELECT scope FROM tool_cache").fetchall() == [(LEGACY_SCOPE,)]
        store = EncryptedObjectStore(FileObjectStore(tmp_path / "o"), os.urandom(32), "t")
        cache = ToolCache(c, store)
        for scope in (kind_scope("refund"), kind_scope("chat"), SHARED_SCOPE):
            assert cache.lookup("orders.get", {"order": 7}, scope=scope) == (False, None)
        cache.store_result("orders.get", {"order": 7}, {"fresh": True}, scope=kind_scope("refund"))
        assert cache.lookup("orders.get", {"order": 7}, scope=kind_scope("refund")) == (True, {"fresh": True})
        assert c.execute("SELECT count(*) FROM tool_cache").fetchone() == (2,)
