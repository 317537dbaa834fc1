"""Cached tool outputs carry the authority they were fetched under: after the credential is revoked they
are not served, and after a new grant they are fetched again under it."""

from __future__ import annotations

from typing import Any

from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks

calls: list[str] = []

crm = Agent("crm-reader")


@crm.step
def read_account(ctx: Context) -> Any:
    def fetch() -> dict[str, Any]:
        calls.append(ctx.credential("crm-key").value)  # the paid call, made with the key
        return {"account": ctx.params["account"], "balance": 12}

    return ctx.tool("crm.account", {"account": ctx.params["account"]}, fetch, credential="crm-key")


def _run(rt: Runtime) -> tuple[str, str | None]:
    tid = tasks.submit(rt.conn, "crm-reader", {"account": "A-1"})
    outcome = run_task(rt, crm, tid)
    task = tasks.get(rt.conn, tid)
    assert task is not None
    return outcome, task.blocked_reason


def test_a_cached_output_is_not_served_after_its_credential_is_revoked(runtime: Runtime) -> None:
    rt = runtime
    creds = rt.credentials
    calls.clear()
    creds.set("crm-key", "key-v1")  # type: ignore[attr-defined]
    assert _run(rt) == ("done", None) and calls == ["key-v1"]
    assert _run(rt) == ("done", None) and calls == ["key-v1"]  # served from the cache: not paid again
    creds.revoke("crm-key")  # type: ignore[attr-defined]
    assert _run(rt) == ("blocked", "credential_unavailable")
    assert calls == ["key-v1"]  # neither fetched nor served from the revoked grant
    creds.set("crm-key", "key-v2")  # type: ignore[attr-defined]
    assert _run(rt) == ("done", None) and calls == ["key-v1", "key-v2"]  # fetched again under the new grant
    assert _run(rt) == ("done", None) and calls == ["key-v1", "key-v2"]
    row = rt.conn.execute("SELECT credential, credential_version FROM tool_cache WHERE tool = 'crm.account'"
                          ).fetchone()
    assert row == ("crm-key", 2)
