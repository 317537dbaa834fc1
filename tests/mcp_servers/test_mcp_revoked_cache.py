"""Issue 34, "a revoked credential → not served": a read-only MCP tool's cached output is bound to the version of
the credential it was fetched under. A real agent-host (its instance token a real one) resolves the MCP server's
credential through a live control plane's internal API; the MCP server is the official `mcp` SDK's (its own
process, checking the bearer token on every request).

The same read, task after task: served from the cache while the credential holds (the server sees one call); once
the customer's credential is revoked in the vault, the next task is not served the cached output but blocks on the
credential like any call without one (the server sees nothing); stored again (a new version), the blocked task
resumes by itself and fetches afresh under the new version rather than being handed the old version's output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.checkpoints import CheckpointStore
from agent_runtime.state.migrations import migrate
from tenants.actors import SYSTEM
from tests.runtime.harness import HostRunner, TenantDB, admin_dsn, create_tenant_db, drop_tenant_db, make_env
from tests.runtime.test_mcp_tools import APP, TOKEN, _pythonpath, start_mcp_peer
from tests.vault.test_vault_helpers import make_instance, make_tenant
from vault.services import credential_put, credential_revoke


@pytest.fixture
def tenant_db() -> Iterator[TenantDB]:
    t = create_tenant_db(admin_dsn(), prefix="mcprev")
    try:
        yield t
    finally:
        drop_tenant_db(t, admin_dsn())


def test_a_revoked_credential_is_not_served_the_cached_mcp_read_and_a_new_version_fetches_afresh(
        live_server, operator, tenant_db: TenantDB, tmp_path: Path) -> None:
    tenant = make_tenant(operator)
    token = make_instance(tenant)
    credential_put(tenant=tenant, name="peer-token", value=TOKEN, actor=SYSTEM)
    peer = start_mcp_peer(tmp_path, tmp_path / "mcp-calls.jsonl")
    servers = {"peer": {"url": peer.url, "credential": "peer-token"}}
    env = make_env(tenant_db, tmp_path, AGENT_APP=APP, AGENT_TENANT_ID=str(tenant.pk), AGENT_INSTANCE_TOKEN=token,
                   AGENT_CONTROL_PLANE_URL=live_server.url, AGENT_MCP_SERVERS=json.dumps(servers),
                   AGENT_HEARTBEAT_INTERVAL_S="0.5", PYTHONPATH=_pythonpath())
    conn = connect(tenant_db.dsn, tenant_db.schema, autocommit=True)
    migrate(conn, tenant_db.schema)
    runner = HostRunner(tmp_path)

    def finished(tid: Any, timeout_s: float = 30) -> tuple[str, str | None, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            task = tasks.get(conn, tid)
            assert task is not None
            if task.status == "done":
                store = CheckpointStore(conn)
                return "done", None, store.case_file(store.latest(tid)).steps_done["read"]
            if task.status == "blocked":
                return "blocked", task.blocked_reason, None
            assert time.monotonic() < deadline, (task.status, runner.procs[-1].output()[-3000:])
            time.sleep(0.05)

    try:
        runner.start(env)
        first = finished(tasks.submit(conn, "mcp-read", {"order": "o-1"}))
        assert first[:2] == ("done", None) and first[2]["served"] == 1
        again = finished(tasks.submit(conn, "mcp-read", {"order": "o-1"}))
        assert peer.sessions() == 1
        assert again == first and len(peer.calls("lookup_order")) == 1  # the cache served it: the server saw one call
        assert len(peer.calls("lookup_order")) == 1

        credential_revoke(tenant=tenant, name="peer-token", actor=SYSTEM)
        revoked = tasks.submit(conn, "mcp-read", {"order": "o-1"})  # the very read the cache holds
        assert finished(revoked)[:2] == ("blocked", "credential_unavailable")
        assert len(peer.calls("lookup_order")) == 1  # nothing sent, and the cached output not handed over

        credential_put(tenant=tenant, name="peer-token", value=TOKEN, actor=SYSTEM)  # stored again: version 2
        status, _reason, result = finished(revoked)
        deadline = time.monotonic() + 30
        while status != "done" and time.monotonic() < deadline:  # resumed by the host within a heartbeat
            time.sleep(0.1)
            status, _reason, result = finished(revoked)
        assert status == "done"
        assert result["served"] == 2  # fetched afresh under version 2, not the version-1 output
        assert len(peer.calls("lookup_order")) == 2
        assert peer.sessions() == 2  # the open session was version 1's: version 2 opened its own
    finally:
        runner.stop_all()
        peer.proc.stop()
        conn.close()
