"""Cached tool outputs carry the authority they were fetched under: after the credential is revoked they
are not served, and after a new grant they are fetched again under it."""

from __future__ import annotations

from typing import Any

import pytest

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
    assert row == ('[["crm-key",2]]', None)  # every credential the output was fetched under, with its version


direct = Agent("crm-direct")


@direct.step
def read_directly(ctx: Context) -> Any:
    """The fetch reads the credential itself (no `credential=`): `how` says through which door."""
    def fetch() -> dict[str, Any]:
        key = ctx.credentials.get("crm") if ctx.params["how"] == "credentials.get" else ctx.credential("crm")
        calls.append(key.value)
        return {"account": ctx.params["account"], "balance": 7}

    account = {"account": ctx.params["account"]}
    if not ctx.params.get("nested"):
        return ctx.tool("crm.direct", account, fetch)
    # An output built from another tool's output holds that output's authority too (hit or fetched).
    return ctx.tool("crm.report", account, lambda: {"report": ctx.tool("crm.direct", account, fetch)})


def _run_direct(rt: Runtime, **params: Any) -> tuple[str, str | None]:
    tid = tasks.submit(rt.conn, "crm-direct", {"account": "A-2", "how": "credentials.get", **params})
    outcome = run_task(rt, direct, tid)
    task = tasks.get(rt.conn, tid)
    assert task is not None
    return outcome, task.blocked_reason


@pytest.mark.parametrize("how", ["credentials.get", "credential"])
def test_a_credential_the_fetch_reads_itself_is_the_outputs_authority(runtime: Runtime, how: str) -> None:
    rt = runtime
    creds = rt.credentials
    calls.clear()
    creds.set("crm", "crm-v1")  # type: ignore[attr-defined]
    assert _run_direct(rt, how=how) == ("done", None) and calls == ["crm-v1"]
    assert _run_direct(rt, how=how) == ("done", None) and calls == ["crm-v1"]  # a hit while the grant holds
    creds.revoke("crm")  # type: ignore[attr-defined]
    assert _run_direct(rt, how=how) == ("blocked", "credential_unavailable")  # not served: refetched, refused
    assert calls == ["crm-v1"]
    creds.set("crm", "crm-v2")  # type: ignore[attr-defined]
    assert _run_direct(rt, how=how) == ("done", None) and calls == ["crm-v1", "crm-v2"]  # fetched again
    assert _run_direct(rt, how=how) == ("done", None) and calls == ["crm-v1", "crm-v2"]


def test_an_output_built_from_another_tools_output_holds_its_authority(runtime: Runtime) -> None:
    rt = runtime
    creds = rt.credentials
    calls.clear()
    creds.set("crm", "crm-v1")  # type: ignore[attr-defined]
    assert _run_direct(rt) == ("done", None) and calls == ["crm-v1"]  # crm.direct cached
    assert _run_direct(rt, nested=True) == ("done", None) and calls == ["crm-v1"]  # crm.report from the hit
    assert _run_direct(rt, nested=True) == ("done", None) and calls == ["crm-v1"]  # crm.report is a hit
    creds.revoke("crm")  # type: ignore[attr-defined]
    assert _run_direct(rt, nested=True) == ("blocked", "credential_unavailable") and calls == ["crm-v1"]
    creds.set("crm", "crm-v2")  # type: ignore[attr-defined]
    assert _run_direct(rt, nested=True) == ("done", None) and calls == ["crm-v1", "crm-v2"]


def test_a_row_from_before_keeps_its_one_credential_as_authority(runtime: Runtime) -> None:
    rt = runtime
    creds = rt.credentials
    creds.set("legacy", "v1")  # type: ignore[attr-defined]
    rt.tool_cache.store_result("old.tool", {}, {"x": 1}, scope="kind:old")
    rt.conn.execute("UPDATE tool_cache SET credential = 'legacy', credential_version = 1 WHERE tool = 'old.tool'")
    held = {"legacy": 1}

    def holds(name: str, version: int) -> bool:
        return held.get(name) == version

    assert rt.tool_cache.lookup("old.tool", {}, holds, scope="kind:old") == (True, {"x": 1})
    assert rt.tool_cache.lookup("old.tool", {}, scope="kind:old") == (False, None)  # never served without asking
    held["legacy"] = 2
    assert rt.tool_cache.lookup("old.tool", {}, holds, scope="kind:old") == (False, None)
