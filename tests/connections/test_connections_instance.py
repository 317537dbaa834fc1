"""Issue 33, second slice, end to end: a customer's connected account used by its agent inside a real ``agent-host``
(started by the local driver through the real onboarding, a real Celery worker, a live web server), against the
real OAuth 2.0 authorization server of tests/oauth_peer.py. The step calls the provider's userinfo endpoint with
the token it got from ``ctx.connections``; the provider revoking the grant blocks the next task
``connection_needs_reauth``, and the customer connecting again resumes it without anyone pressing Retry.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from connections.models import Connection
from connections.services import connection_tokens_read
from portal.connection_views import connections_panel
from provisioning.fleet.instances import instance_submit_task
from releases.assignments import release_default_set
from releases.services import release_create
from tenants.actors import SYSTEM
from tenants.models import Operator, Tenant
from tenants.services import operator_create
from tenants.tokens import operator_token_issue
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.connections.test_connections import consent, register, start
from tests.oauth_peer import OAuthPeer
from tests.releases.test_agent_config import _query
from tests.releases.test_releases_upload import make_wheel
from tests.vault.test_vault_helpers import make_instance, make_tenant
from webhooks.models import Event
from webhooks.runtime_events import runtime_events_detect

AGENT = '''
import hashlib
import json
import urllib.request

from agent_runtime.sdk import Agent

agent = Agent("calendar", connections=["acme"])


@agent.step
def look(ctx):
    token = ctx.connections.get("acme").access_token()
    req = urllib.request.Request(ctx.params["userinfo"], headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=10) as answer:
        who = json.loads(answer.read())
    return {"sub": who["sub"], "token_sha": hashlib.sha256(token.encode()).hexdigest()}
'''


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    with OAuthPeer() as running:  # 60 s access tokens: under OAUTH_REFRESH_AHEAD_S, each delivery refreshes
        yield running


def connect_latest(api: APIClient, tenant: Tenant) -> Connection:
    started = start(api, tenant.pk)
    assert started.status_code == 201, started.content
    assert Client().get("/oauth/callback", consent(started.json()["authorization_url"])).status_code == 200
    found = Connection.objects.filter(tenant=tenant).order_by("-created_at").first()
    assert found is not None
    return found


def task_row(tenant: Tenant, task_id: object) -> tuple[Any, ...]:
    return _query(tenant, "SELECT status, blocked_reason, blocked_detail, blocked_credential FROM {s}.tasks"
                          " WHERE id = %s", task_id)[0]


def result(tenant: Tenant, task_id: object) -> dict[str, Any]:
    rows = _query(tenant, "SELECT value FROM {s}.case_entries WHERE task_id = %s AND kind = 'done' AND key = 'look'",
                  task_id)
    return dict(rows[0][0])


def internal_status(base: str, token: str, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=20) as answer:  # noqa: S310 - the live test server
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read()


def calendar_operator(settings, live_server, worker_factory, slug: str) -> tuple[Operator, APIClient, Path]:  # type: ignore[no-untyped-def]
    """An operator whose default release is the calendar agent above, a Celery worker that starts its customers'
    instances against the live control plane, and an API client with the operator's token. The caller removes
    the releases ``root`` at the end."""
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    operator = operator_create(slug=f"{slug}-{secrets.token_hex(3)}", name="Connections operator", actor=SYSTEM)
    filename, data = make_wheel("calendar-agent", f"1.0.{secrets.randbelow(10**6)}", module=AGENT,
                                entry_points="[agent_runtime.agents]\ncalendar = calendar_agent:agent\n")
    release = release_create(operator=operator, actor=SYSTEM, filename=filename, data=data)
    release_default_set(operator=operator, release_id=release.pk, actor=SYSTEM)
    worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url, RELEASES_ROOT=str(root))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {operator_token_issue(operator=operator, actor=SYSTEM).plaintext}")
    return operator, api, root


@pytest.mark.django_db(transaction=True)
def test_the_agent_uses_its_customers_connection_blocks_on_needs_reauth_and_resumes_after_reconnect(
        live_server, worker_factory, settings, peer) -> None:  # type: ignore[no-untyped-def]
    operator, api, root = calendar_operator(settings, live_server, worker_factory, "conn")
    try:
        tenant = onboard_ready(operator, f"conn-{secrets.token_hex(3)}")
        assert register(api, peer).status_code == 201
        first = connect_latest(api, tenant)
        issued_at_connect = connection_tokens_read(connection=first).access_token
        params = {"userinfo": f"{peer.issuer}/userinfo"}

        # The token reaches the step, and the provider accepts it there. It was refreshed before use (60 s left
        # is within OAUTH_REFRESH_AHEAD_S), by the control plane, sending the refresh token once.
        task = instance_submit_task(tenant=tenant, kind="calendar", params=params, actor=SYSTEM)
        assert wait_for(lambda: task_row(tenant, task)[0] in ("done", "blocked", "failed"), timeout=120,
                        what="the first task finished")
        assert task_row(tenant, task)[0] == "done", task_row(tenant, task)
        used = result(tenant, task)
        assert used["sub"] == "user-alice"
        current = connection_tokens_read(connection=first).access_token
        assert used["token_sha"] == sha(current) != sha(issued_at_connect)
        assert len(peer.refresh_presented) >= 1 and peer.reuse_detected == [] and peer.revoked_families == set()

        # A second customer's real instance token asks for the same provider: nothing of A's.
        other = make_tenant(operator)
        status, body = internal_status(live_server.url, make_instance(other), "/internal/v1/connections/acme")
        assert status == 404 and current.encode() not in body

        # The customer removes the app at the provider: the next task blocks, naming the provider.
        peer.revoke_all()
        blocked = instance_submit_task(tenant=tenant, kind="calendar", params=params, actor=SYSTEM)
        assert wait_for(lambda: task_row(tenant, blocked)[0] in ("done", "blocked", "failed"), timeout=120,
                        what="the second task stopped")
        status_, reason, detail, waits_on = task_row(tenant, blocked)
        assert (status_, reason, waits_on) == ("blocked", "connection_needs_reauth", "acme"), task_row(tenant, blocked)
        assert "'acme'" in detail and "connect it again" in detail
        first.refresh_from_db()
        assert first.status == "needs_reauth" and first.status_reason == "invalid_grant"
        # The customer and the operator are told: the portal's banner names the provider, a
        # `connection.needs_reauth` webhook event, and the task's own `task.blocked` event with the reason (what
        # beat's runtime-events sweep records, run here once) -- none of them with a token.
        assert connections_panel(tenant)["connections_need_reauth"] == ["acme"]
        told = Event.objects.get(tenant=tenant, type="connection.needs_reauth")
        assert told.data == {"connection": str(first.pk), "provider": "acme", "reason": "invalid_grant"}
        runtime_events_detect()
        task_blocked = Event.objects.get(tenant=tenant, type="task.blocked", data__task=str(blocked))
        assert task_blocked.data["reason"] == "connection_needs_reauth" and task_blocked.data["retryable"] is True
        assert current not in json.dumps([told.data, task_blocked.data])

        # The customer connects again: the host finds out within a heartbeat and the task runs to the end.
        mended = connect_latest(api, tenant)
        assert wait_for(lambda: task_row(tenant, blocked)[0] in ("done", "failed"), timeout=90,
                        what="the blocked task resumed by itself")
        assert task_row(tenant, blocked)[0] == "done"
        assert result(tenant, blocked)["token_sha"] == sha(connection_tokens_read(connection=mended).access_token)
        events = _query(tenant, "SELECT event FROM {s}.step_events WHERE task_id = %s ORDER BY id", blocked)
        assert [e[0] for e in events if e[0] == "retried"] == []  # nobody pressed Retry
    finally:
        kill_session_instances()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.django_db(transaction=True)
def test_the_runtimes_source_tells_needs_the_customer_from_not_now(live_server, peer) -> None:  # type: ignore[no-untyped-def]
    """The instance side's `ControlPlaneConnectionSource` against the live control plane: a token; 404 and 409 are
    "the customer must connect" (the task blocks); an unreachable control plane or provider is "not now" (the
    task waits and retries). No message carries a token."""
    import socket

    from agent_runtime.errors import ConnectionUnavailable
    from agent_runtime.host.connections import ControlPlaneConnectionSource
    from connections.models import OAuthClient

    operator = operator_create(slug=f"src-{secrets.token_hex(3)}", name="Source operator", actor=SYSTEM)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {operator_token_issue(operator=operator, actor=SYSTEM).plaintext}")
    assert register(api, peer).status_code == 201
    tenant, bare = make_tenant(operator), make_tenant(operator)
    connection = connect_latest(api, tenant)
    source = ControlPlaneConnectionSource(live_server.url, make_instance(tenant))

    got = source.token("acme")
    assert got.value == connection_tokens_read(connection=connection).access_token
    assert got.account_id == "user-alice" and got.value not in repr(got) and got.value not in repr(source)
    assert source.available("acme") and not source.available("other")

    def refused(src: ControlPlaneConnectionSource, provider: str) -> ConnectionUnavailable:
        with pytest.raises(ConnectionUnavailable) as caught:
            src.token(provider)
        assert got.value not in str(caught.value) and caught.value.provider == provider
        return caught.value

    assert refused(ControlPlaneConnectionSource(live_server.url, make_instance(bare)), "acme").transient is False
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    assert refused(ControlPlaneConnectionSource(nowhere, "token"), "acme").transient is True
    # The provider down and the token expired: not now.
    OAuthClient.objects.filter(pk=connection.oauth_client_id).update(token_endpoint=f"{nowhere}/token")
    Connection.objects.filter(pk=connection.pk).update(expires_at=connection.created_at)
    assert refused(source, "acme").transient is True
    # The provider refusing the grant: the customer must connect again.
    OAuthClient.objects.filter(pk=connection.oauth_client_id).update(token_endpoint=f"{peer.issuer}/token")
    peer.revoke_all()
    needs = refused(source, "acme")
    assert needs.transient is False and "connect it again" in str(needs)
    assert not source.available("acme")
