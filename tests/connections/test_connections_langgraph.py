"""Issue 33: a LangGraph node or tool uses the customer's connected account through the same delivery path as
``ctx.connections`` (``agent_runtime.integrations.langgraph.connection``): a real graph on a real tenant schema,
compiled with TenantCheckpointer, asking the live control plane's signed internal API with a real instance token,
whose token the real OAuth peer (tests/oauth_peer.py) accepts. Another tenant's instance and a release that did not
declare the provider are refused, and no token lands in the graph's checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterator
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

from agent_runtime.db import connect as runtime_connect
from agent_runtime.errors import ConnectionUnavailable
from agent_runtime.host.connections import ControlPlaneConnectionSource
from agent_runtime.integrations.langgraph import TenantCheckpointer, connection
from agent_runtime.state.migrations import migrate
from connections.services import connection_tokens_read
from releases.models import AgentRelease, ReleaseAssignment
from tests.connections.test_connections import connect, register
from tests.oauth_peer import OAuthPeer
from tests.runtime.harness import admin_dsn, create_tenant_db, drop_tenant_db
from tests.vault.test_vault_helpers import make_instance, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict, total=False):
    sub: str
    token_sha: str


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def look(state: State) -> State:
    """A node as an author writes it: the token is asked for at the moment of use and never returned."""
    token = connection("acme").access_token()
    req = urllib.request.Request(f"{PEER_ISSUER[0]}/userinfo", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as answer:  # noqa: S310 - the local peer
        who = json.loads(answer.read())
    return {"sub": who["sub"], "token_sha": sha(token)}


PEER_ISSUER: list[str] = [""]


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    with OAuthPeer() as running:
        PEER_ISSUER[0] = running.issuer
        yield running


@pytest.fixture
def tenant_schema() -> Iterator[psycopg.Connection]:
    admin = admin_dsn()
    db = create_tenant_db(admin, prefix="lgconn")
    conn = runtime_connect(db.dsn, db.schema, autocommit=True)
    migrate(conn, db.schema)
    try:
        yield conn
    finally:
        conn.close()
        drop_tenant_db(db, admin)


def graph_for(conn: psycopg.Connection, source: ControlPlaneConnectionSource) -> Any:
    builder = StateGraph(State)
    builder.add_node("look", look)
    builder.add_edge(START, "look")
    builder.add_edge("look", END)
    return builder.compile(checkpointer=TenantCheckpointer(conn, connections=source))


def test_a_langgraph_node_gets_its_customers_token_through_the_control_plane(live_server, api, peer, tenant_schema):
    assert register(api, peer).status_code == 201
    tenant, other = make_tenant(api.operator), make_tenant(api.operator)
    conn_a = connect(api, peer, tenant)

    graph = graph_for(tenant_schema, ControlPlaneConnectionSource(live_server.url, make_instance(tenant)))
    out = graph.invoke({}, {"configurable": {"thread_id": "t1"}})
    # The control plane refreshed (60 s left is within OAUTH_REFRESH_AHEAD_S) and handed out the current token.
    current = connection_tokens_read(connection=conn_a).access_token
    assert out["sub"] == "user-alice" and out["token_sha"] == sha(current)
    assert peer.reuse_detected == []
    # The token is nowhere in the graph's stored state.
    with tenant_schema.cursor() as cur:
        for table in ("lg_checkpoints", "lg_blobs", "lg_writes"):
            cur.execute(f"SELECT coalesce(string_agg(t::text, ''), '') FROM {table} t")  # noqa: S608 - fixed names
            row = cur.fetchone()
            assert row is not None and current not in row[0]

    # Another tenant's instance token: nothing of A's, and the node's failure says it is not connected.
    outsider = graph_for(tenant_schema, ControlPlaneConnectionSource(live_server.url, make_instance(other)))
    with pytest.raises(ConnectionUnavailable, match="not connected") as refused:
        outsider.invoke({}, {"configurable": {"thread_id": "t2"}})
    assert refused.value.transient is False and current not in str(refused.value)

    # A's release stops declaring acme: refused (403), blocking, not retried as transient.
    release = AgentRelease.objects.create(
        operator=api.operator,
        version="9.9.9",
        distribution="quiet-agent",
        digest="sha256:" + "0" * 64,
        size_bytes=1,
        kinds={"quiet": ""},
        connections=[],
    )
    ReleaseAssignment.objects.create(tenant=tenant, release=release)
    with pytest.raises(ConnectionUnavailable, match="not declared") as undeclared:
        graph.invoke({}, {"configurable": {"thread_id": "t3"}})
    assert undeclared.value.transient is False


def test_connection_outside_a_tenant_checkpointer_graph_says_how_to_fix_it(tenant_schema):
    builder = StateGraph(State)
    builder.add_node("look", look)
    builder.add_edge(START, "look")
    builder.add_edge("look", END)
    with pytest.raises(ConnectionUnavailable, match="from_context"):
        builder.compile(checkpointer=TenantCheckpointer(tenant_schema)).invoke({}, {"configurable": {"thread_id": "x"}})
