"""Issue 33, end users inside a real ``agent-host``: tasks the operator sends for two end users of one customer, each
step asking ``ctx.connections.get("acme")`` (the runtime names its task, never a person), each getting its own end
user's token, accepted by the real OAuth server (tests/oauth_peer.py) as that person's; a third end user who has not
connected blocks ``connection_needs_reauth`` (naming the provider, not the person) and resumes by itself once they
connect.
"""

from __future__ import annotations

import json
import secrets
import shutil
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from connections.models import Connection
from connections.services import connection_tokens_read
from tenants.models import Tenant
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.connections.test_connections import consent, register
from tests.connections.test_connections_instance import calendar_operator, peer, result, sha, task_row
from tests.oauth_peer import OAuthPeer

__all__ = ["peer"]  # the fixture (60 s access tokens), shared with test_connections_instance


def connect_for(api: APIClient, peer: OAuthPeer, tenant: Tenant, person: str) -> Connection:
    peer.user = f"{person}@example.com"
    started = api.post(f"/api/v1/tenants/{tenant.pk}/connections", content_type="application/json",
                       data=json.dumps({"provider": "acme", "end_user": f"u-{person}"}))
    assert started.status_code == 201, started.content
    assert Client().get("/oauth/callback", consent(started.json()["authorization_url"])).status_code == 200
    return Connection.objects.get(tenant=tenant, end_user=f"u-{person}", status="active")


def submit_for(api: APIClient, tenant: Tenant, person: str, params: dict[str, Any]) -> str:
    sent = api.post(f"/api/v1/tenants/{tenant.pk}/tasks", content_type="application/json",
                    data=json.dumps({"kind": "calendar", "params": params, "end_user": f"u-{person}"}))
    assert sent.status_code in (200, 201, 202), sent.content
    return str(sent.json()["inbox"]["id"])


@pytest.mark.django_db(transaction=True)
def test_each_end_users_task_gets_its_own_account_and_a_missing_one_blocks_until_they_connect(
        live_server, worker_factory, settings, peer) -> None:  # type: ignore[no-untyped-def]
    operator, api, root = calendar_operator(settings, live_server, worker_factory, "eu")
    try:
        tenant = onboard_ready(operator, f"eu-{secrets.token_hex(3)}")
        assert register(api, peer).status_code == 201
        alice, bob = connect_for(api, peer, tenant, "alice"), connect_for(api, peer, tenant, "bob")
        params = {"userinfo": f"{peer.issuer}/userinfo"}

        done: dict[str, dict[str, Any]] = {}
        for person in ("alice", "bob"):
            task = submit_for(api, tenant, person, params)
            assert wait_for(lambda t=task: task_row(tenant, t)[0] in ("done", "blocked", "failed"), timeout=120,
                            what=f"{person}'s task finished")
            assert task_row(tenant, task)[0] == "done", task_row(tenant, task)
            done[person] = result(tenant, task)
        # Each step got its own end user's token, and the provider took it as that person's.
        assert done["alice"]["sub"] == "user-alice" and done["bob"]["sub"] == "user-bob"
        assert done["alice"]["token_sha"] == sha(connection_tokens_read(connection=alice).access_token)
        assert done["bob"]["token_sha"] == sha(connection_tokens_read(connection=bob).access_token)
        assert peer.reuse_detected == [] and peer.revoked_families == set()

        # Carol has connected nothing: no fallback to anyone's; blocked naming the provider, not her.
        carols = submit_for(api, tenant, "carol", params)
        assert wait_for(lambda: task_row(tenant, carols)[0] in ("done", "blocked", "failed"), timeout=120,
                        what="carol's task stopped")
        status_, reason, detail, waits_on = task_row(tenant, carols)
        assert (status_, reason, waits_on) == ("blocked", "connection_needs_reauth", "acme"), task_row(tenant, carols)
        assert "'acme'" in detail and "carol" not in detail

        # She connects her own: the host finds out within a heartbeat (asking for her task) and it finishes.
        carol = connect_for(api, peer, tenant, "carol")
        assert wait_for(lambda: task_row(tenant, carols)[0] in ("done", "failed"), timeout=90,
                        what="carol's task resumed by itself")
        assert task_row(tenant, carols)[0] == "done"
        assert result(tenant, carols)["sub"] == "user-carol"
        assert result(tenant, carols)["token_sha"] == sha(connection_tokens_read(connection=carol).access_token)
    finally:
        kill_session_instances()
        shutil.rmtree(root, ignore_errors=True)
